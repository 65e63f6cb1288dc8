# -*- test-case-name: tests.test_dcs_memory,tests.test_etcd -*-
"""
What the failover coordinator needs of a consensus service (a "DCS", as
Patroni calls it): a small interface with two implementations, etcd v3
through its JSON gateway (L{rmqha.coord.etcd}) and an in-memory one for
unit tests (L{rmqha.coord.memory}).  ZooKeeper or Kubernetes could be added
behind the same interface.

Every group lives under one prefix, C{/rmqha/<group>/}:

    leader          JSON L{Leader} fields, attached to the leader's lease;
                    its create_revision is the leadership's fencing token
    epoch           the decimal epoch counter, bumped in the election txn
    insync          JSON L{InSync} fields, written only by the leader
                    (guarded by the leader key's create_revision)
    members/<id>    JSON L{Member} fields, each on its node's lease
    switchover      JSON L{Switchover} fields: a planned change of master

All reads used for decisions are linearizable; every write that must not
race is one transaction (L{IDCS.campaign}, L{IDCS.publish_in_sync},
L{IDCS.resign}).  Errors are L{DCSError} with a one-line message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

__all__ = [
    "DCSError",
    "LeaseLost",
    "Lease",
    "Leader",
    "InSync",
    "Member",
    "Switchover",
    "ClusterView",
    "IDCS",
    "IWatch",
    "encode",
    "decode",
    "in_sync_members",
]


class DCSError(Exception):
    """
    The consensus service could not be asked or did not answer (no
    quorum, unreachable, refused): one line naming the endpoint and why.
    """


class LeaseLost(DCSError):
    """
    The lease is gone (expired or revoked): everything attached to it is
    deleted.
    """


@dataclass(frozen=True)
class Lease:
    #: The lease id (etcd's int64).
    id: int
    #: The TTL the service granted, seconds (may exceed what was asked).
    ttl: int


@dataclass(frozen=True)
class Leader:
    node_id: str
    #: The epoch this leadership started.
    epoch: int
    #: The HA address slaves dial (C{--advertise}), C{host:port}.
    ha: str
    #: The admin HTTP address (C{--advertise-http}), if any.
    http: str | None = None
    #: The leader key's create_revision: the fencing token (0 = unknown).
    revision: int = field(default=0, compare=False)
    #: The lease the leader key is attached to (0 = unknown): which
    #: incarnation of the node holds it.
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class InSync:
    """
    The in-sync set the master publishes: the nodes (master included)
    that hold every put the master acknowledged in C{epoch}.
    """

    epoch: int
    members: tuple[str, ...]
    #: The insync key's mod_revision (0 = unknown).
    revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Member:
    """
    What a node says about itself, refreshed while it lives.
    """

    node_id: str
    ha: str
    http: str | None = None
    #: "master" or "slave" (as it acts now).
    role: str = "slave"
    #: The last epoch in its epoch file (0 = none).
    epoch: int = 0
    #: Where its validated log ends.
    offset: int = 0
    #: Its replication state or problem, for operators.
    state: str = ""
    #: False for a node that must never be elected (C{--no-failover}).
    electable: bool = True
    revision: int = field(default=0, compare=False)
    #: The lease the key is attached to (whose process holds the id).
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Switchover:
    #: The node the operator wants as master.
    target: str
    #: The master that must hand over.
    leader: str
    #: Wall-clock seconds the request was made (information only).
    requested_at: float = 0.0
    revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ClusterView:
    """
    One linearizable read of a group.
    """

    leader: Leader | None
    #: The epoch counter (0: never elected).
    epoch: int
    #: The epoch key's mod_revision (0: absent); the election txn compares it.
    epoch_revision: int
    in_sync: InSync | None
    members: dict[str, Member]
    switchover: Switchover | None
    #: The store's revision at the read.
    revision: int


def in_sync_members(leader: str, carried: tuple[str, ...] = ()) -> tuple[str, ...]:
    """
    The members of a new epoch's in-sync set: the leader first, then the
    carried members, each once.
    """
    return (leader, *sorted(set(carried) - {leader}))


def encode(value: Leader | InSync | Member | Switchover) -> bytes:
    """
    A key's value: the dataclass's fields as compact JSON, without the
    revision and lease (which the store keeps).
    """
    fields = asdict(value)
    fields.pop("revision", None)
    fields.pop("lease", None)
    if isinstance(value, InSync):
        fields["members"] = list(value.members)
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def decode(kind: type[Any], data: bytes, revision: int) -> Any:
    """
    The inverse of L{encode}.

    @raise DCSError: the value is not what C{kind} encodes.
    """
    try:
        fields = json.loads(data)
        if not isinstance(fields, dict):
            raise TypeError("not an object")
        if kind is InSync:
            fields["members"] = tuple(str(m) for m in fields["members"])
        return kind(revision=revision, **fields)
    except (ValueError, TypeError, KeyError) as e:
        raise DCSError(f"unreadable {kind.__name__.lower()} value {data[:80]!r}: {e}") from None


class IWatch(Interface):
    def stop() -> None:
        """
        Stop watching; no callback comes after this.
        """


class IDCS(Interface):
    """
    One group's keys in a consensus service.  Every method returns a
    L{Deferred} that fails with L{DCSError} (or L{LeaseLost}) within the
    implementation's request timeout, which is below any lease TTL.
    """

    group = Attribute("The group (RocketMQ's brokerName).")
    endpoint = Attribute("Where the service is, for messages (no credentials).")

    def grant(ttl: int) -> Deferred[Lease]:
        """
        A new lease of C{ttl} seconds.
        """

    def keepalive(lease: Lease) -> Deferred[int]:
        """
        Renew C{lease} to its full TTL; fires with the TTL now left.

        @raise LeaseLost: the lease expired or was revoked.
        """

    def revoke(lease: Lease) -> Deferred[None]:
        """
        End C{lease} now, deleting its keys (gone already is not an error).
        """

    def load() -> Deferred[ClusterView]:
        """
        A linearizable read of every key of the group.
        """

    def campaign(
        leader: Leader, lease: Lease, seen: ClusterView, carried: tuple[str, ...] = ()
    ) -> Deferred[Leader | None]:
        """
        Become the leader, in one transaction that succeeds only if there
        is no leader key, the epoch key is unchanged since C{seen}
        (C{seen.epoch_revision}) and so is the insync key: puts the leader
        key (on C{lease}) with epoch C{seen.epoch + 1}, the epoch key, and
        an insync key of C{{leader} + carried} for the new epoch (the
        members of the old set that stay eligible should the winner not
        take office: docs/failover.md).

        @return: the new L{Leader} (with its epoch and revision), or
            C{None} when the transaction's comparison failed (someone else
            moved first).
        """

    def publish_in_sync(in_sync: InSync, leader: Leader) -> Deferred[InSync | None]:
        """
        Write the in-sync set, only while C{leader} still holds the leader
        key (its create_revision is C{leader.revision}).

        @return: the written L{InSync} with its revision, or C{None} if
            C{leader} is no longer the leader.
        """

    def touch_member(member: Member, lease: Lease) -> Deferred[None]:
        """
        Put this node's member key, attached to C{lease}.
        """

    def resign(leader: Leader) -> Deferred[bool]:
        """
        Delete the leader key if it is still C{leader}'s (same
        create_revision); the lease stays.  Fires C{True} if deleted.
        """

    def request_switchover(switchover: Switchover) -> Deferred[bool]:
        """
        Ask for a switchover: put the switchover key only if the leader
        key is still C{switchover.leader}'s and no switchover is pending.
        """

    def clear_switchover(switchover: Switchover) -> Deferred[None]:
        """
        Delete the switchover key if it is still C{switchover}
        (same mod_revision).
        """

    def close() -> Deferred[None]:
        """
        Release connections (after the last call).
        """

    def watch(on_change: Callable[[], None], on_error: Callable[[DCSError], None]) -> IWatch:
        """
        Call C{on_change()} after any change under the group's prefix (and
        once when the watch starts or restarts, since changes may have been
        missed): the caller then L{load}s.  C{on_error} is called when the
        service cannot be watched (no quorum, unreachable); the watch keeps
        retrying until stopped.
        """
