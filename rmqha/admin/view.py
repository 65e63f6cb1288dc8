# -*- test-case-name: tests.test_admin_view,tests.test_admin -*-
"""
The admin interface's read-only view of a broker: L{broker_status} takes
one L{BrokerStatus} snapshot, composed of the snapshots each part gives
of what it owns --

    the store       L{CommitLogService.status}  -> L{StoreStatus}
    the scrub       L{ScrubService.snapshot}    -> L{ScrubStatus}
    a master's side L{MasterSide.status}        -> L{MasterSideStatus}
    a slave         L{Replica.status}           -> L{ReplicaStatus}
    failover        the coordinator's C{status()} (a JSON object)
    the NameServers L{NameServerRegistration.status} -> L{NameServerStatus}

-- plus the broker's own put counters.  C{GET /status} is its
L{BrokerStatus.as_json}; the Prometheus collector
(L{rmqha.admin.metrics}) reads the same snapshot.  This module imports
the broker's parts; they never import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Protocol

from rmqha.broker import Broker
from rmqha.ha.config import Role
from rmqha.ha.group import PutStatus
from rmqha.ha.masterside import MasterSideStatus
from rmqha.ha.replica import ReplicaStatus
from rmqha.remoting.registration import NameServerStatus
from rmqha.remoting.sync import SyncStatus
from rmqha.store.scrub import ScrubStatus
from rmqha.store.service import StoreStatus

__all__ = [
    "BrokerStatus",
    "DiskSpace",
    "disk_space",
    "PutFigures",
    "FailoverStatus",
    "broker_status",
    "status",
    "FailoverSource",
    "hide_coordinator",
]

#: What C{/status} says of how members prove their node ids when they do
#: not (C{--insecure-group}).
_INSECURE = "none (--insecure-group)"


@dataclass(frozen=True)
class PutFigures:
    """
    The puts this broker took as a master.

    @ivar statuses: how many puts ended with each L{PutStatus}.
    @ivar replication_wait: the cumulative buckets, (upper bound,
        count), of the seconds SYNC_MASTER puts waited for their slaves;
        C{replication_wait_total} the sum of those seconds.
    """

    puts: int
    put_bytes: int
    statuses: Mapping[PutStatus, int]
    replication_wait: tuple[tuple[str, int], ...]
    replication_wait_total: float


@dataclass(frozen=True)
class DiskSpace:
    """
    The file system the store is on (C{statvfs}): C{free_bytes} is what
    the broker's user may still write (C{f_bavail}, reserved blocks not
    counted), C{size_bytes} its size.
    """

    free_bytes: int
    size_bytes: int


def disk_space(directory: str) -> DiskSpace | None:
    """
    The space of the file system C{directory} is on, or C{None} when it
    cannot be read (the directory gone).
    """
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return DiskSpace(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


@dataclass(frozen=True)
class FailoverStatus:
    """
    Failover mode (docs/failover.md): the coordinator's own status (the
    group, its master, epochs, the in-sync set, the last election) and how
    members prove their node ids to each other.
    """

    coordinator: Mapping[str, Any]
    auth: str

    def as_json(self) -> dict[str, Any]:
        """
        The C{failover} object of C{/status}.
        """
        return {**self.coordinator, "auth": self.auth}


@dataclass(frozen=True)
class BrokerStatus:
    """
    One broker as it stands, read-only.

    @ivar master: on a master (and only there), its side of replication
        (no slaves while none is running).
    @ivar replica: on a slave (and only there), its replication (stopped,
        with nothing counted, while no replica runs: standing by).
    @ivar master_endpoint: on a slave, the master's endpoint description.
    @ivar problem: on a slave, why it is not replicating; on a master, why
        it refuses every put; or C{None} (L{Broker.problem}).
    @ivar failover: in failover mode, the coordinator's view.
    @ivar disk: the store's file system (not in C{/status}: it changes
        between two reads).
    @ivar metadata_sync: the slave's metadata sync, when the broker has
        one (L{rmqha.remoting.sync}); C{taken_at}: the clock's time of the
        snapshot, for its age.
    @ivar namesrv: with C{--namesrv}, the registration with each
        NameServer.
    """

    role: Role
    store: StoreStatus
    scrub: ScrubStatus
    puts: PutFigures
    problem: str | None
    master: MasterSideStatus | None = None
    replica: ReplicaStatus | None = None
    master_endpoint: str | None = None
    failover: FailoverStatus | None = None
    disk: DiskSpace | None = None
    metadata_sync: SyncStatus | None = None
    namesrv: tuple[NameServerStatus, ...] | None = None
    taken_at: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """
        What C{GET /status} answers (but C{serve_commitlog}, the admin
        site's own).
        """
        store = self.store
        result: dict[str, Any] = {
            "role": self.role.value,
            "min_offset": store.min_offset,
            "max_offset": store.max_offset,
            "flushed_offset": store.flushed_offset,
            # The pages faulted in ahead of the puts (docs/store.md), or
            # None where there is no pre-faulting.
            "prefault": None if store.prefault is None else {
                "asks": store.prefault.asks,
                "skipped_no_spare_cpu": store.prefault.skipped,
                "cpu_seconds": round(store.prefault.cpu_seconds, 3),
            },
            # The background scrub and what it found (docs/store.md, "Scrub").
            "scrub": self.scrub.as_dict(),
        }
        if self.master is not None:
            result["slaves"] = [
                {
                    "peer": s.peer,
                    "ack_offset": s.ack_offset,
                    "lag_bytes": s.lag_bytes,
                    "lag_seconds": None if s.lag_seconds is None else round(s.lag_seconds, 3),
                    "bytes_per_s": round(s.bytes_per_s, 1),
                    "connected_since": s.connected_since,
                    "transport": s.transport,
                    "identity": s.identity,
                    "framing": s.framing,
                    "replica_id": s.replica_id,
                    # Failover: it proved replica_id as the group requires
                    # (the group secret, or a certificate naming it).
                    "authenticated": s.authenticated,
                }
                for s in sorted(self.master.slaves, key=lambda s: s.peer)
            ]
            # The copies a put would count now, and the copies a PUT_OK
            # needs (docs/sync.md).
            result["in_sync_replicas"] = self.master.in_sync_replicas
            result["min_in_sync_replicas"] = self.master.min_in_sync_replicas
            # Why every put is refused (a segment file changed under the
            # store: docs/store.md), or null.
            result["problem"] = self.problem
        elif self.replica is not None:
            replica = self.replica
            result["master"] = self.master_endpoint
            result["connected"] = replica.connected
            result["lag_bytes"] = 0 if replica.caught_up else None
            # Checked framing: CRC-32 on every frame and report (docs/protocol.md).
            result["framing"] = "checked" if replica.checked else "classic"
            # Replication is halted on this, when set (docs/reliability.md).
            result["divergence"] = replica.divergence.as_dict() if replica.divergence else None
            # Checks of the master that could not finish, in a row (retried).
            result["failed_checks"] = replica.failed_checks
            # Failover: cuts back to the newest epoch shared with the master
            # (docs/failover.md), and the bytes they moved to quarantine.
            result["epoch_truncations"] = replica.epoch_truncations
            result["epoch_truncated_bytes"] = replica.epoch_truncated_bytes
            # What the master is (rmqha, rocketmq, or null while unknown), and
            # why replication is not running, if it is not (docs/protocol.md).
            result["master_kind"] = replica.master_kind
            result["problem"] = self.problem
        if self.failover is not None:
            result["failover"] = self.failover.as_json()
        if self.metadata_sync is not None:
            # The slave's copy of the master's topics, offsets and groups
            # (docs/remoting.md, "The slave's metadata sync").
            result["metadata_sync"] = self.metadata_sync.as_json(self.taken_at)
        if self.namesrv is not None:
            # The registration with each NameServer (docs/remoting.md,
            # "NameServers").
            result["namesrv"] = [n.as_json(self.taken_at) for n in self.namesrv]
        return result


class FailoverSource(Protocol):
    """
    What the view reads of a failover coordinator
    (L{rmqha.coord.node.Coordinator}): its own status, as JSON.
    """

    def status(self) -> dict[str, Any]: ...


def broker_status(broker: Broker, failover: FailoverSource | None = None) -> BrokerStatus:
    """
    A snapshot of C{broker} (running: its store is open), and of its
    C{failover} coordinator if it has one.

    @raise RuntimeError: the broker is not running.
    """
    role = broker.role
    side = broker.role_service
    # (The role service in a change of role may be the other kind for a
    # moment: the role decides which half is shown.)
    side_status = side.status() if side is not None else None
    master: MasterSideStatus | None = None
    replica: ReplicaStatus | None = None
    endpoint: str | None = None
    if role.is_master:
        master = side_status if isinstance(side_status, MasterSideStatus) else MasterSideStatus()
    else:
        replica = side_status if isinstance(side_status, ReplicaStatus) else ReplicaStatus()
        endpoint = broker.master_endpoint
    failover_status: FailoverStatus | None = None
    if failover is not None:
        auth = broker.role_services.group_auth
        failover_status = FailoverStatus(
            MappingProxyType(failover.status()),
            auth.mode if auth is not None else _INSECURE,
        )
    waits = broker.put_path.replication_wait
    commitlog = broker.store.commitlog
    return BrokerStatus(
        role=role,
        store=broker.store.status(),
        scrub=broker.scrub.snapshot(),
        puts=PutFigures(
            puts=broker.put_path.puts,
            put_bytes=broker.put_path.put_bytes,
            statuses=MappingProxyType(dict(broker.put_path.put_statuses)),
            replication_wait=tuple(waits.cumulative()),
            replication_wait_total=waits.total,
        ),
        problem=broker.problem,
        master=master,
        replica=replica,
        master_endpoint=endpoint,
        failover=failover_status,
        disk=disk_space(commitlog.store_dir) if commitlog is not None else None,
        metadata_sync=broker.metadata_sync.status() if broker.metadata_sync is not None else None,
        namesrv=broker.registration.status() if broker.registration is not None else None,
        taken_at=broker.reactor.seconds(),
    )


def status(broker: Broker, failover: FailoverSource | None = None) -> dict[str, Any]:
    """
    What C{GET /status} answers (L{BrokerStatus.as_json}).
    """
    return broker_status(broker, failover).as_json()


def hide_coordinator(failover: dict[str, Any]) -> dict[str, Any]:
    """
    C{failover} (L{status}'s) as a caller without a verified client
    certificate sees it: where the coordinator is, and its errors (which
    name it), are hidden; whether it answers is not.
    """
    shown = dict(failover)
    kind = str(failover.get("coordinator") or "").partition(":")[0] or "coordinator"
    shown["coordinator"] = f"{kind} (hidden)"
    if failover.get("coordinator_error") is not None:
        shown["coordinator_error"] = "(hidden: the coordinator does not answer; see the log)"
    return shown
