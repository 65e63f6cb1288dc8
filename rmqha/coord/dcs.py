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

A key whose value cannot be read does not fail a read: L{read_group}
skips it and the L{ClusterView} reports it (L{Malformed}); what a skipped
key means for an election is decided in L{rmqha.coord.candidacy.rank}
(docs/failover.md, "Malformed keys").
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, Callable, Iterable

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

__all__ = [
    "ROOT",
    "DCSError",
    "LeaseLost",
    "Lease",
    "Leader",
    "InSync",
    "Member",
    "Switchover",
    "ClusterView",
    "Malformed",
    "StoredKey",
    "MAX_MALFORMED",
    "IDCS",
    "IWatch",
    "encode",
    "decode",
    "in_sync_members",
    "read_group",
    "group_names",
]

#: Where every group's prefix lives: C{/rmqha/<group>/}.
ROOT = "/rmqha/"


def group_names(keys: Iterable[str]) -> list[str]:
    """
    The groups C{keys} (whole keys) belong to, sorted, once each.
    """
    return sorted({k[len(ROOT):].split("/", 1)[0] for k in keys if k.startswith(ROOT) and "/" in k[len(ROOT):]})


#: The most malformed keys a L{ClusterView} lists (the group's own keys
#: first, then members); L{ClusterView.malformed_total} counts them all.
MAX_MALFORMED = 16


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
class Malformed:
    """
    A key under the group's prefix whose value is not what the key holds:
    skipped by the read, reported here.
    """

    #: The key's name under the group's prefix (C{leader}, C{members/b}).
    name: str
    #: The whole key, as C{etcdctl} names it (C{/rmqha/<group>/leader}).
    key: str
    #: Why it cannot be read (one line).
    reason: str
    #: The key's mod_revision (a transaction that replaces it compares it).
    revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ClusterView:
    """
    One linearizable read of a group.
    """

    leader: Leader | None
    #: The epoch counter (0: never elected, or its key is malformed).
    epoch: int
    #: The epoch key's mod_revision (0: absent); the election txn compares it.
    epoch_revision: int
    in_sync: InSync | None
    members: dict[str, Member]
    switchover: Switchover | None
    #: The store's revision at the read.
    revision: int
    #: Keys skipped because their values cannot be read: the group's own
    #: keys (leader, epoch, insync, switchover) first, at most
    #: L{MAX_MALFORMED}.
    malformed: tuple[Malformed, ...] = ()
    #: How many keys were skipped (may exceed C{len(malformed)}).
    malformed_total: int = 0

    def malformed_key(self, name: str) -> Malformed | None:
        """
        The report on key C{name} (C{leader}, C{epoch}, C{insync},
        C{switchover}) if it was skipped.
        """
        for bad in self.malformed:
            if bad.name == name:
                return bad
        return None

    @property
    def in_sync_revision(self) -> int:
        """
        The insync key's mod_revision, readable or not (0: absent): what
        the election transaction compares.
        """
        if self.in_sync is not None:
            return self.in_sync.revision
        bad = self.malformed_key("insync")
        return bad.revision if bad is not None else 0


@dataclass(frozen=True)
class StoredKey:
    """
    One key of a group as the store holds it (for L{read_group}).
    """

    #: The name under the group's prefix.
    name: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


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
    The inverse of L{encode}: every field of C{kind} of its type (a
    missing one takes its default), no other field.

    @raise DCSError: the value is not what C{kind} encodes (one line).
    """
    try:
        values = json.loads(data)
    except (ValueError, RecursionError):
        raise DCSError(f"not JSON: {_quote(data)}") from None
    if not isinstance(values, dict):
        raise DCSError(f"not a JSON object: {_quote(data)}")
    known = {f.name: f for f in fields(kind) if f.name not in ("revision", "lease")}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise DCSError(f"unknown field {unknown[0][:40]!r}: {_quote(data)}")
    for name, spec in known.items():
        if name not in values:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise DCSError(f"no {name}: {_quote(data)}")
            continue
        check = _FIELD_CHECKS[str(spec.type)]
        if not check(values[name]):
            raise DCSError(f"{name} is not {_FIELD_WORDS[str(spec.type)]}: {_quote(data)}")
    if kind is InSync:
        values["members"] = tuple(values["members"])
    return kind(revision=revision, **values)


def _quote(data: bytes, size: int = 40) -> str:
    shown = repr(data[:size])
    return shown + ("…" if len(data) > size else "")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


#: How each field type of the key dataclasses is checked (by its annotation).
_FIELD_CHECKS: dict[str, Callable[[object], bool]] = {
    "str": lambda v: isinstance(v, str),
    "str | None": lambda v: v is None or isinstance(v, str),
    "int": _count,
    "bool": lambda v: isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
}
_FIELD_WORDS = {
    "str": "a string",
    "str | None": "a string or null",
    "int": "a non-negative integer",
    "bool": "true or false",
    "float": "a number",
    "tuple[str, ...]": "a list of strings",
}

_DECIMAL = re.compile(rb"[0-9]{1,18}")

#: The keys of a group other than members, in the order they are reported.
_GROUP_KEYS = ("leader", "epoch", "insync", "switchover")


def read_group(prefix: str, keys: Iterable[StoredKey], revision: int) -> ClusterView:
    """
    A L{ClusterView} from a group's keys (every L{IDCS} reads through
    this, so they skip and report the same keys).  A key whose value
    cannot be read is left out of the view and listed in its
    C{malformed}: a member's key that does not hold that member, a leader,
    insync or switchover key that does not decode, an epoch that is not a
    decimal number.  Unknown keys are ignored (a newer version's).
    """
    leader = in_sync = switchover = None
    epoch = epoch_revision = 0
    members: dict[str, Member] = {}
    bad: list[Malformed] = []
    for stored in keys:
        name = stored.name
        try:
            if name == "leader":
                leader = decode(Leader, stored.value, stored.create_revision)
                leader = Leader(
                    leader.node_id, leader.epoch, leader.ha, leader.http,
                    revision=stored.create_revision, lease=stored.lease,
                )
            elif name == "insync":
                in_sync = decode(InSync, stored.value, stored.mod_revision)
            elif name == "switchover":
                switchover = decode(Switchover, stored.value, stored.mod_revision)
            elif name.startswith("members/") and len(name) > len("members/"):
                member = replace(decode(Member, stored.value, stored.mod_revision), lease=stored.lease)
                node_id = name[len("members/"):]
                if member.node_id != node_id:
                    raise DCSError(f"it holds node {member.node_id!r}, not {node_id!r}")
                members[node_id] = member
            elif name == "epoch":
                if not _DECIMAL.fullmatch(stored.value):
                    raise DCSError(f"not a decimal epoch: {_quote(stored.value)}")
                epoch = int(stored.value)
                epoch_revision = stored.mod_revision
        except DCSError as e:
            bad.append(Malformed(name, prefix + name, str(e), revision=stored.mod_revision))
    order = {name: i for i, name in enumerate(_GROUP_KEYS)}
    bad.sort(key=lambda m: (order.get(m.name, len(order)), m.name))
    return ClusterView(
        leader=leader,
        epoch=epoch,
        epoch_revision=epoch_revision,
        in_sync=in_sync,
        members=members,
        switchover=switchover,
        revision=revision,
        malformed=tuple(bad[:MAX_MALFORMED]),
        malformed_total=len(bad),
    )


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
        A linearizable read of every key of the group (through
        L{read_group}: a key whose value cannot be read is skipped and
        listed in the view's C{malformed}, never an error).
        """

    def groups() -> Deferred[list[str]]:
        """
        The groups that have a key under the service's C{/rmqha/} prefix,
        sorted (for an operator's hint: C{cluster status} on a group with
        no node names those there are).

        @raise DCSError: they cannot be listed (a user whose role reaches
            only its own group's prefix, say).
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
