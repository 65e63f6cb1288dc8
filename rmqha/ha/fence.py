# -*- test-case-name: tests.test_wiring,tests.test_coordinator -*-
"""
Whether a master may take and acknowledge puts (L{IFence} providers).

A broker with fixed roles is never fenced: L{OPEN}.  A failover broker
gets a L{Fence} when it is built; its coordinator (L{rmqha.coord.node})
writes what etcd says into it -- elected or not, until when the lease is
good, a switchover in progress, the group's live members -- and the put
path reads it.  The fence holds state, not callables: the coordinator and
the put path share one object that both were given at construction.
"""

from __future__ import annotations

from typing import Callable

from zope.interface import implementer

from rmqha.ha.interfaces import IFence

__all__ = ["Fence", "OPEN"]


@implementer(IFence)
class _Open:
    """
    Fixed roles: every put may be taken and acknowledged, every replica
    counts.
    """

    def refusing(self) -> str | None:
        return None

    def may_acknowledge(self) -> bool:
        return True

    def accepts_node(self, node: str, host: str) -> bool:
        return True

    def __repr__(self) -> str:
        return "rmqha.ha.fence.OPEN"


#: The fence of a broker with fixed roles.
OPEN = _Open()


@implementer(IFence)
class Fence:
    """
    Failover mode: what the coordinator's view of etcd allows this master.

    @ivar elected: this node holds the leader key.
    @ivar valid_until: until when (by C{now}) this master's lease is known
        to be good: it takes and acknowledges puts only before then.
    @ivar handing_over: the node a switchover is handing over to, or
        C{None}.
    @ivar members: the group's live members (node ids).
    """

    def __init__(self, me: str, now: Callable[[], float]) -> None:
        """
        @param me: this node's id (never a counted replica of itself).
        @param now: the clock the lease is read by (the coordinator's).
        """
        self.me = me
        self._now = now
        self.elected = False
        self.valid_until = float("-inf")
        self.handing_over: str | None = None
        self.members: frozenset[str] = frozenset()

    def refusing(self) -> str | None:
        if not self.elected:
            return "this node is not the elected master"
        if self.handing_over is not None:
            return f"handing over to {self.handing_over} (switchover)"
        if self._now() >= self.valid_until:
            return "this master's lease is not renewed: it no longer takes puts"
        return None

    def may_acknowledge(self) -> bool:
        return self.elected and self._now() < self.valid_until

    def accepts_node(self, node: str, host: str) -> bool:
        """
        C{node} must be a live member of the group other than this node.
        C{node} is the id the replica proved (the group secret's
        handshake, or its TLS certificate), never one it only declared,
        unless the group runs with C{--insecure-group}
        (L{rmqha.ha.master.MasterConnection.failover_node};
        docs/failover.md, "Who counts").  The connection's address is not
        compared with the member's advertised one: a host's outgoing
        address is often not the one it advertises (several addresses,
        NAT, 127.0.0.x on loopback).
        """
        return node in self.members and node != self.me
