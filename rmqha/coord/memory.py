# -*- test-case-name: tests.test_dcs_memory,tests.test_coordinator -*-
"""
An in-memory L{IDCS} for unit tests: one L{MemoryStore} (the "cluster",
with revisions, leases that expire on an injected clock, and watches) and
one L{MemoryDCS} per node, each of which can be cut off from the store
(C{reachable = False}) to play a partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import implementer

from rmqha.coord.dcs import (
    IDCS,
    ROOT,
    ClusterView,
    DCSError,
    InSync,
    IWatch,
    Leader,
    Lease,
    LeaseLost,
    Member,
    StoredKey,
    Switchover,
    encode,
    group_names,
    in_sync_members,
    read_group,
)


@dataclass
class _Key:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


class MemoryStore:
    """
    The shared state: keys with revisions, leases and watchers.

    @ivar available: C{False} plays a store without quorum: every request
        of every node fails.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.keys: dict[str, _Key] = {}
        self.revision = 1
        self.available = True
        self._leases: dict[int, tuple[int, IDelayedCall]] = {}
        self._next_lease = 0x1000
        self._watchers: list[tuple[str, _Watch]] = []

    # -- leases ------------------------------------------------------------

    def grant(self, ttl: int) -> Lease:
        self._next_lease += 1
        lease = self._next_lease
        self._leases[lease] = (ttl, self.clock.callLater(ttl, self.expire, lease))
        return Lease(lease, ttl)

    def keepalive(self, lease: int) -> int:
        if lease not in self._leases:
            raise LeaseLost(f"lease {lease:x} is gone")
        ttl, call = self._leases[lease]
        call.reset(ttl)
        return ttl

    def expire(self, lease: int) -> None:
        """
        End C{lease} now (expiry or revoke), deleting its keys.
        """
        entry = self._leases.pop(lease, None)
        if entry is None:
            return
        if entry[1].active():
            entry[1].cancel()
        doomed = [k for k, v in self.keys.items() if v.lease == lease]
        if doomed:
            self.revision += 1
            for key in doomed:
                del self.keys[key]
            self._notify(doomed)

    def leases(self) -> list[int]:
        return list(self._leases)

    # -- keys --------------------------------------------------------------

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        if lease and lease not in self._leases:
            raise LeaseLost(f"lease {lease:x} is gone")
        old = self.keys.get(key)
        created = old.create_revision if old is not None else self.revision
        self.keys[key] = _Key(value, created, self.revision, lease)

    def delete(self, key: str) -> bool:
        return self.keys.pop(key, None) is not None

    def commit(self, changed: list[str]) -> None:
        """
        End a transaction that changed C{changed}: one revision, watchers
        told.
        """
        if changed:
            self._notify(changed)

    def begin(self) -> None:
        self.revision += 1

    def create_revision(self, key: str) -> int:
        entry = self.keys.get(key)
        return entry.create_revision if entry is not None else 0

    def mod_revision(self, key: str) -> int:
        entry = self.keys.get(key)
        return entry.mod_revision if entry is not None else 0

    # -- watches -----------------------------------------------------------

    def _notify(self, keys: list[str]) -> None:
        for prefix, watch in list(self._watchers):
            if any(k.startswith(prefix) for k in keys):
                watch.changed()

    def add_watch(self, prefix: str, watch: "_Watch") -> None:
        self._watchers.append((prefix, watch))

    def remove_watch(self, watch: "_Watch") -> None:
        self._watchers = [(p, w) for p, w in self._watchers if w is not watch]


@implementer(IWatch)
class _Watch:
    def __init__(
        self,
        dcs: "MemoryDCS",
        on_change: Callable[[], None],
        on_error: Callable[[DCSError], None],
    ) -> None:
        self._dcs = dcs
        self._on_change = on_change
        self._on_error = on_error
        self.stopped = False
        self._pending: IDelayedCall | None = None

    def changed(self) -> None:
        # A later turn, as a network watch would: never re-entering the
        # caller that made the change.
        if self.stopped or self._pending is not None:
            return
        self._pending = self._dcs.store.clock.callLater(0, self._deliver)

    def _deliver(self) -> None:
        self._pending = None
        if self.stopped:
            return
        if self._dcs.reachable and self._dcs.store.available:
            self._on_change()
        else:
            self._on_error(self._dcs.unavailable())

    def stop(self) -> None:
        self.stopped = True
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        self._dcs.store.remove_watch(self)


@implementer(IDCS)
class MemoryDCS:
    """
    One node's view of a L{MemoryStore}.

    @ivar reachable: C{False} cuts this node off: its requests fail with
        L{DCSError} and its watches report errors (a partition).
    """

    endpoint = "memory"

    def __init__(self, store: MemoryStore, group: str) -> None:
        self.store = store
        self.group = group
        self.prefix = f"{ROOT}{group}/"
        self.reachable = True
        #: Requests made, by method (for tests).
        self.calls: dict[str, int] = {}
        self._watches: list[_Watch] = []

    def set_reachable(self, reachable: bool) -> None:
        """
        Cut this node off (or heal it): its watches hear of it at once.
        """
        self.reachable = reachable
        self._watches = [w for w in self._watches if not w.stopped]
        for watch in self._watches:
            watch.changed()

    def unavailable(self) -> DCSError:
        why = "no quorum" if not self.store.available else "unreachable"
        return DCSError(f"etcd {self.endpoint}: {why}")

    def _call(self, name: str, work: Callable[[], Any]) -> Deferred[Any]:
        self.calls[name] = self.calls.get(name, 0) + 1
        if not (self.reachable and self.store.available):
            return fail(self.unavailable())
        try:
            return succeed(work())
        except DCSError as e:
            return fail(e)

    def _key(self, name: str) -> str:
        return self.prefix + name

    # -- leases ------------------------------------------------------------

    def grant(self, ttl: int) -> Deferred[Lease]:
        return self._call("grant", lambda: self.store.grant(ttl))

    def keepalive(self, lease: Lease) -> Deferred[int]:
        return self._call("keepalive", lambda: self.store.keepalive(lease.id))

    def revoke(self, lease: Lease) -> Deferred[None]:
        return self._call("revoke", lambda: self.store.expire(lease.id))

    # -- reads -------------------------------------------------------------

    def load(self) -> Deferred[ClusterView]:
        return self._call("load", self._view)

    def _view(self) -> ClusterView:
        keys = [
            StoredKey(key[len(self.prefix):], entry.value, entry.create_revision,
                      entry.mod_revision, entry.lease)
            for key, entry in sorted(self.store.keys.items())
            if key.startswith(self.prefix)
        ]
        return read_group(self.prefix, keys, self.store.revision)

    def groups(self) -> Deferred[list[str]]:
        return self._call("groups", lambda: group_names(self.store.keys))

    # -- transactions --------------------------------------------------------

    def campaign(
        self, leader: Leader, lease: Lease, seen: ClusterView, carried: tuple[str, ...] = ()
    ) -> Deferred[Leader | None]:
        def txn() -> Leader | None:
            store = self.store
            if (
                store.create_revision(self._key("leader")) != 0
                or store.mod_revision(self._key("epoch")) != seen.epoch_revision
                or store.mod_revision(self._key("insync")) != seen.in_sync_revision
            ):
                return None
            if lease.id not in store.leases():
                raise LeaseLost(f"lease {lease.id:x} is gone")
            store.begin()
            epoch = seen.epoch + 1
            won = Leader(
                leader.node_id, epoch, leader.ha, leader.http, revision=store.revision, lease=lease.id
            )
            store.put(self._key("leader"), encode(won), lease.id)
            store.put(self._key("epoch"), str(epoch).encode())
            store.put(
                self._key("insync"),
                encode(InSync(epoch, in_sync_members(leader.node_id, carried))),
            )
            store.commit([self._key("leader"), self._key("epoch"), self._key("insync")])
            return won

        return self._call("campaign", txn)

    def _holds(self, leader: Leader) -> bool:
        return leader.revision != 0 and self.store.create_revision(self._key("leader")) == leader.revision

    def publish_in_sync(self, in_sync: InSync, leader: Leader) -> Deferred[InSync | None]:
        def txn() -> InSync | None:
            if not self._holds(leader):
                return None
            self.store.begin()
            self.store.put(self._key("insync"), encode(in_sync))
            self.store.commit([self._key("insync")])
            return InSync(in_sync.epoch, in_sync.members, revision=self.store.revision)

        return self._call("publish_in_sync", txn)

    def touch_member(self, member: Member, lease: Lease) -> Deferred[None]:
        def put() -> None:
            key = self._key("members/" + member.node_id)
            if lease.id not in self.store.leases():
                raise LeaseLost(f"lease {lease.id:x} is gone")
            self.store.begin()
            self.store.put(key, encode(member), lease.id)
            self.store.commit([key])

        return self._call("touch_member", put)

    def resign(self, leader: Leader) -> Deferred[bool]:
        def txn() -> bool:
            if not self._holds(leader):
                return False
            self.store.begin()
            self.store.delete(self._key("leader"))
            self.store.commit([self._key("leader")])
            return True

        return self._call("resign", txn)

    def request_switchover(self, switchover: Switchover) -> Deferred[bool]:
        def txn() -> bool:
            current = self._view().leader
            if (
                current is None
                or current.node_id != switchover.leader
                or self._key("switchover") in self.store.keys
            ):
                return False
            self.store.begin()
            self.store.put(self._key("switchover"), encode(switchover))
            self.store.commit([self._key("switchover")])
            return True

        return self._call("request_switchover", txn)

    def clear_switchover(self, switchover: Switchover) -> Deferred[None]:
        def txn() -> None:
            if self.store.mod_revision(self._key("switchover")) != switchover.revision:
                return
            self.store.begin()
            self.store.delete(self._key("switchover"))
            self.store.commit([self._key("switchover")])

        return self._call("clear_switchover", txn)

    def close(self) -> Deferred[None]:
        return succeed(None)

    def watch(self, on_change: Callable[[], None], on_error: Callable[[DCSError], None]) -> IWatch:
        watch = _Watch(self, on_change, on_error)
        self.store.add_watch(self.prefix, watch)
        self._watches.append(watch)
        watch.changed()
        return watch
