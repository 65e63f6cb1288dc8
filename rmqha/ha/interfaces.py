# -*- test-case-name: tests.test_wiring -*-
"""
What the parts of a master's put path need from each other, as interfaces.

A part is given the providers it needs when it is built, and checks them
there (L{provides}): nothing assigns a callable onto another object after
construction (docs/architecture.md, "How the parts are wired").  The
providers are:

  - L{IAppendedTo} (L{rmqha.store.interfaces}): how far the store has
    appended (the commit log, or the L{rmqha.store.service.CommitLogService}
    that opens it);
  - L{IReplicaAcks}: what the master's replicas have acknowledged
    (L{rmqha.ha.replicas.Replicas}, fed by the master's connections);
  - L{IFence}: whether this master may take and acknowledge puts, and
    whose acks count (L{rmqha.ha.fence.OPEN} for fixed roles,
    L{rmqha.ha.fence.Fence} written by the failover coordinator);
  - L{IReleaseListener}: told as a release of waiting puts is about to
    fire its last one (L{rmqha.ha.replicas.EarlyFrames});
  - L{IInSyncObserver}: told when the failover in-sync set changes or is
    lost (L{rmqha.ha.group.HAService}, the coordinator).
"""

from __future__ import annotations

from typing import Any, TypeVar

from zope.interface import Interface
from zope.interface.exceptions import Invalid
from zope.interface.verify import verifyObject

from rmqha.store.interfaces import IAppendedTo

__all__ = [
    "IAppendedTo",
    "IFence",
    "IInSyncObserver",
    "IReleaseListener",
    "IReplicaAcks",
    "provides",
]

_T = TypeVar("_T")


def provides(interface: Any, provider: _T, what: str) -> _T:
    """
    C{provider}, checked to provide C{interface} (its declaration and its
    methods' signatures: L{zope.interface.verify.verifyObject}).

    @param what: the parameter, for the error.
    @raise TypeError: naming C{what} and the interface.
    """
    try:
        verifyObject(interface, provider)
    except Invalid as e:
        raise TypeError(f"{what} must provide {interface.__name__}: {e}") from None
    return provider


class IReplicaAcks(Interface):
    """
    What a master's replicas have acknowledged: the input of the quorum.
    """

    def ack_offsets() -> list[int]:
        """
        The ack of every replicating slave that has acknowledged anything,
        one per replica.
        """

    def node_acks() -> dict[str, int]:
        """
        Failover mode: the highest ack of each counted node, by node id.
        """

    def live_count(past: int = -1) -> int:
        """
        How many replicas' links deliver acks (who counts as connected,
        fixed roles) with an ack past offset C{past} (any ack: -1).
        """

    def live_nodes() -> set[str]:
        """
        Failover mode: the counted nodes whose links deliver acks.
        """


class IFence(Interface):
    """
    Whether this master may take and acknowledge puts, and whose acks
    count: in failover mode, what its lease and the group allow.
    """

    def refusing() -> str | None:
        """
        Why this master may not take a put now, or C{None}.
        """

    def may_acknowledge() -> bool:
        """
        Whether this master may still answer C{PUT_OK} (checked as each
        put is released).
        """

    def accepts_node(node: str, host: str) -> bool:
        """
        Whether a replica proven to be node C{node}, connected from
        C{host}, counts for the in-sync set.
        """


class IReleaseListener(Interface):
    """
    Told by a release of waiting puts (L{rmqha.ha.group.GroupTransferService.release}).
    """

    def last_of_release() -> None:
        """
        The release is about to fire the last waiting put the quorum
        offset covers: what that put's callback appends has no later
        callback of this release to travel with.
        """


class IInSyncObserver(Interface):
    """
    Told about the failover in-sync set (L{rmqha.ha.insync.InSyncSet}).
    """

    def in_sync_changed() -> None:
        """
        The effective set changed: the quorum moves.
        """

    def in_sync_lost(why: str) -> None:
        """
        The coordinator refused the set: this node is no longer the
        leader (called once).
        """
