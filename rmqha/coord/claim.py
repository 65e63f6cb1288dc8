# -*- test-case-name: tests.test_coordinator -*-
"""
A failover node's claim on its node id: whether this process may write the
member key, or waits for an earlier run's key to go, or must refuse to run
beside another live process with the same node id (docs/failover.md, "One
process per node id").

Sans-IO: the coordinator (L{rmqha.coord.node.Coordinator}) loads the group
and hands each view to L{NodeIdClaim.consider}; what to do about the answer
(a note for /status, stopping the process) stays with the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.logger import Logger

from rmqha.coord.dcs import ClusterView, Lease


@dataclass(frozen=True)
class Verdict:
    """
    What one look at the group says about the node id.

    @ivar waiting: why this process waits (a new holder was seen), if so.
    @ivar refused: why this process must not run at all, if so.
    """

    waiting: str | None = None
    refused: str | None = None


class NodeIdClaim:
    """
    Before a process writes its member key the first time, whether the
    node id is free.  A key on another lease is a previous run of this node
    (killed: its lease runs out within the TTL, the key goes) or another
    live process started with the same C{--node-id} (it renews the key
    every interval): wait for the first, refuse to run beside the second --
    two processes writing one member key would make it flap, and both would
    answer for one replica.

    @ivar claimed: whether the member key is this process's to write (no
        other live process holds the node id).
    """

    _log = Logger()

    def __init__(self, group: str, node_id: str) -> None:
        self._group = group
        self._node_id = node_id
        self.claimed = False
        # The other holder seen so far: (its lease, its key's revision).
        self._rival: tuple[int, int] | None = None

    def consider(self, view: ClusterView, lease: Lease) -> Verdict:
        """
        Look at the group's member key for this node id, this process
        holding C{lease}: it is claimed (L{claimed}) if free or already on
        C{lease}; a holder seen for the first time is waited for; a holder
        that renewed its key while this process waited is another live
        process.
        """
        me = self._node_id
        held = view.members.get(me)
        if held is None or held.lease == lease.id:
            self.claimed = True
            self._rival = None
            return Verdict()
        rival = self._rival
        if rival is None or rival[0] != held.lease:
            self._rival = (held.lease, held.revision)
            waiting = (
                f"node id {me} is held by lease {held.lease:x} (HA {held.ha}): waiting "
                "for it to run out (an earlier run of this node) or to be renewed "
                "(another live process with this node id)"
            )
            self._log.info("{note}", note=waiting)
            return Verdict(waiting=waiting)
        if held.revision != rival[1]:
            return Verdict(
                refused=f"node id {me} is already live in group {self._group}: held by "
                f"the process advertising HA {held.ha}"
                + (f" and HTTP {held.http}" if held.http else "")
                + f" (lease {held.lease:x}, renewed while this one waited); this process "
                "does not join: stop that one first, or give this one another --node-id"
            )
        return Verdict()
