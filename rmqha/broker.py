# -*- test-case-name: tests.test_roles,tests.test_group,tests.test_slave_probe,tests.test_tap,tests.test_settings,tests.test_admin,tests.integration.test_sync_master -*-
"""
A broker: the commit log plus ONE HA role, as one service tree.

    master:  CommitLogService + ScrubService + MasterSide (rmqha.ha.masterside)
    slave:   CommitLogService + ScrubService + Replica    (rmqha.ha.replica)

The role service is built when the store has been opened (the store opens
in C{startService}, after twistd has daemonised), so the protocols always
work on an open log; the ports are listened on before that.  The role can
change at run time on the same open store (L{Broker.become_master},
L{Broker.become_slave}).  This is also the embedding API: build a
L{Broker} from its L{BrokerSettings} (L{rmqha.settings}) with a reactor
and a store opener (or let L{rmqha.assemble.build_service} build the whole
service tree), start it, and L{Broker.put} messages on a master.
"""

from __future__ import annotations

import errno
from typing import Any, Callable

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from rmqha._limits import (
    FD_RESERVE,
    ConnectionBudget,
    LimitedFactory,
    raise_fd_limit,
)
from rmqha._ports import ListenFailed, Port, listen
from rmqha.store._record import Message
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import AppendResult, CommitLog
from rmqha.store.errors import SegmentCreateError
from rmqha.ha.config import DEFAULT_MAX_UNFLUSHED, MasterKind, Role
from rmqha.ha.auth import GroupAuth
from rmqha.ha.epochs import EpochFile
from rmqha.ha.fence import OPEN
from rmqha.ha.group import Histogram, PutMessageResult, PutStatus, timed_out_as
from rmqha.ha.haport import HAGate
from rmqha.ha.interfaces import IFence
from rmqha.ha.master import MasterFactory, SlaveStatus
from rmqha.ha.masterside import MasterSide
from rmqha.ha.replica import Replica, ReplicaState
from rmqha.ha.roles import RoleMachine, RoleState
from rmqha.store.scrub import ScrubService
from rmqha.store.service import CommitLogService
from rmqha.settings import BrokerSettings
from rmqha.tls import exposure_warning

__all__ = [
    "Role",
    "Broker",
    "NotStoredError",
    "NotMasterError",
    "ListenFailed",
    "DEFAULT_MAX_UNFLUSHED",
    "INSECURE_GROUP_WARNING",
]

#: Logged at start by a failover node whose peers prove no node ids.
INSECURE_GROUP_WARNING = (
    "insecure group (--insecure-group): node ids on the HA port are only "
    "declared, so anyone who reaches it can pose as a member, acknowledge "
    "puts it does not hold (a PUT_OK may then be lost) or pose as the master; "
    "use --group-secret-file or TLS client certificates (docs/failover.md, "
    '"Who counts")'
)


def _stop_after(_: object, service: IService) -> Deferred[None]:
    return _stopped(service)


def _stopped(service: IService) -> Deferred[None]:
    stopping = service.stopService()
    d: Deferred[Any] = stopping if isinstance(stopping, Deferred) else succeed(None)
    return d.addBoth(lambda _: None)


#: OS errors meaning the disk (or the user's quota) is full.
_DISK_FULL = frozenset([errno.ENOSPC, errno.EDQUOT])


def default_max_cut(slave_fallbehind_max: int) -> int:
    """
    The most bytes a failover slave's checks may cut from its log by
    default: twice C{haSlaveFallbehindMax} -- an in-sync member lags its
    master by at most that much, and a deposed master stores at most about
    as much again in its last lease (docs/failover.md, "Bounded cuts").
    """
    return 2 * slave_fallbehind_max


class NotStoredError(Exception):
    """
    A put that stored nothing, with the RocketMQ status saying why (a
    L{PutMessageResult} always means "stored").

    @ivar status: the L{PutStatus}.
    @ivar errno: for a store failure, the OS error number (C{ENOSPC}:
        the disk is full), else C{None}.
    """

    def __init__(self, status: PutStatus, text: str, error_number: int | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.errno = error_number

    @property
    def disk_full(self) -> bool:
        """
        Whether the store failed for want of space (C{ENOSPC}, C{EDQUOT}).
        """
        return self.errno in _DISK_FULL


class NotMasterError(NotStoredError):
    """
    Messages are put on the master only.
    """

    def __init__(self, text: str) -> None:
        super().__init__(PutStatus.SERVICE_NOT_AVAILABLE, text)


class Broker(MultiService):
    """
    One broker.

    @ivar store: the L{CommitLogService}.
    @ivar role_service: the running L{MasterSide} or L{Replica}.
    """

    _log = Logger()

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        reactor: Any,
        open_commitlog: Callable[[], CommitLog],
        coordinated: bool | None = None,
        retry_policy: Callable[[int], float] | None = None,
        run_in_thread: Callable[[Callable[[], None]], Deferred[None]] | None = None,
        fd_limit: Callable[[], int] = raise_fd_limit,
        epochs: EpochFile | None = None,
        group_auth: GroupAuth | None = None,
    ) -> None:
        """
        @param settings: every user setting (L{BrokerSettings}, checked
            when built): the role, the ports, RocketMQ's HA settings, the
            slave's checks, the limits.  Its C{ha_listen} and
            C{master_endpoint} may be endpoints (L{rmqha.tls.server_endpoint},
            L{rmqha.tls.client_endpoint}) as well as descriptions.  The
            store settings (C{store_dir} ...) are C{open_commitlog}'s.
        @param reactor: the reactor (or a test's fake).
        @param open_commitlog: opens the store (in C{startService});
            L{rmqha.assemble.build_service} makes one from the settings.
        @param coordinated: a failover coordinator gives this broker its
            role (L{rmqha.coord.node}): it starts as a slave with no
            master yet (standing by), and C{settings.role} is its role once
            elected.  Default: whether C{settings.coordinator} is set.
        @param retry_policy: a slave's delay before its Nth reconnection
            attempt (default: L{ClientService}'s back-off).
        @param run_in_thread: how the store runs its flushes (default: the
            reactor's thread pool; see L{CommitLogService}).
        @param fd_limit: called at start: raises the open-files limit and
            returns the soft limit; all ports together keep
            C{FD_RESERVE} descriptors of it free for the store.
        @param epochs: the store's epoch file (failover, docs/failover.md):
            a master records each epoch it is elected in
            (L{become_master}) and answers slaves' EPOCHS; a slave follows
            only masters that answer EPOCHS, never one at an older epoch
            than it has seen, and cuts its log back to the newest epoch it
            shares with its master.  C{None}: no epochs (fixed roles).
        @param group_auth: failover: how this node and its peers prove
            their node ids on the HA port (docs/failover.md, "Who counts"):
            a master counts only proven ids, a slave follows only a master
            that proves the elected leader's id.  C{None} with
            C{coordinated}: ids are only declared (C{--insecure-group},
            warned about at start).
        """
        MultiService.__init__(self)
        if coordinated is None:
            coordinated = settings.failover
        #: The settings this broker was built with.
        self.settings = settings
        self.reactor = reactor
        #: The role, and the only place it changes (L{RoleMachine}).
        self.roles = RoleMachine(self, Role.SLAVE if coordinated else settings.role, reactor)
        self.config = settings.ha_config
        self.in_sync_replicas = settings.in_sync_replicas
        self.min_in_sync_replicas = settings.min_in_sync_replicas
        self.slave_fallbehind_max = settings.slave_fallbehind_max
        self.sync_flush_timeout = settings.sync_flush_timeout
        self.slave_timeout = settings.slave_timeout
        self.max_connections = settings.max_connections
        self.max_connections_per_peer = settings.max_connections_per_peer
        self._ha_listen = settings.ha_listen
        self.roles.endpoint = settings.master_address
        self._peer_policy = settings.peer_policy
        self._on_divergence = settings.on_divergence
        self._master_kind = settings.followed_kind
        if epochs is not None and self._master_kind is MasterKind.ROCKETMQ:
            raise ValueError(
                "master kind rocketmq and epochs (failover) do not go together: a "
                "RocketMQ master keeps no epochs"
            )
        #: The store's epoch file (failover), or C{None}.
        self.epochs = epochs
        #: Failover: the most bytes a slave's checks may cut from its log.
        self.max_cut = (
            settings.max_cut
            if settings.max_cut is not None
            else default_max_cut(settings.slave_fallbehind_max)
        )
        self._probe_timeout = settings.probe_timeout
        self._retry_policy = retry_policy
        self._max_unflushed = settings.max_unflushed
        self._fd_limit = fd_limit
        self._replica_id = settings.node_id
        self._coordinated = coordinated
        #: How node ids are proven (failover), or C{None}.
        self.group_auth = group_auth
        #: How many puts ended with each status.
        self.put_statuses: dict[PutStatus, int] = {s: 0 for s in PutStatus}
        #: Seconds SYNC_MASTER puts waited for their slaves.
        self.replication_wait = Histogram()
        #: The connection limiter of each listening port, by name.
        self.port_limits: dict[str, LimitedFactory] = {}
        self.connection_budget: ConnectionBudget | None = None
        self._listening = False
        #: Messages and bytes put on this master.
        self.puts = 0
        self.put_bytes = 0
        # Whether the last put failed in the store (logged once).
        self._store_failing = False
        self.store = CommitLogService(
            open_commitlog,
            reactor,
            flush_interval=settings.flush_interval,
            run_in_thread=run_in_thread,
        )
        self.store.setName("store")  # type: ignore[no-untyped-call]
        self.store.setServiceParent(self)  # type: ignore[no-untyped-call]
        #: The background scrub of the store (docs/store.md, "Scrub").
        self.scrub = ScrubService(
            lambda: self.store.commitlog,
            reactor,
            rate=settings.scrub_rate,
            slave=lambda: self.roles.is_slave,
        )
        self.scrub.setName("scrub")  # type: ignore[no-untyped-call]
        self.scrub.setServiceParent(self)  # type: ignore[no-untyped-call]
        #: Failover: the HA port, held for this broker's whole life in every
        #: role (docs/failover.md, "The HA port has an owner"), and its
        #: factory (the master's while master, else NOT_MASTER answers).
        self._ha_gate: HAGate | None = None
        self._ha_port: StreamServerEndpointService | None = None
        #: Failover mode: the L{rmqha.coord.node.Coordinator} giving this
        #: broker its role (for /status and the master hint).
        self.coordinator: Any = None

    # -- the role (owned by self.roles) -------------------------------------

    @property
    def role(self) -> Role:
        """
        The role in effect (L{RoleMachine.role}).
        """
        return self.roles.role

    @property
    def role_service(self) -> MasterSide | Replica | None:
        """
        The running L{MasterSide} or L{Replica} (L{RoleMachine.service}).
        """
        service: MasterSide | Replica | None = self.roles.service
        return service

    @property
    def halted(self) -> bool:
        """
        Replication halted until an operator acts (a divergence, a cut
        beyond --max-cut, a wrong segment size), or the store found damaged
        under the running broker: such a node must not lead.
        """
        side = self.roles.service
        if isinstance(side, Replica) and side.state is ReplicaState.HALTED:
            return True
        # (A segment file cut, removed or replaced under the log: it takes
        # no writes until restarted, so it must not lead either.)
        commitlog = self.store.commitlog
        return commitlog is not None and commitlog.damage is not None

    # -- the role services --------------------------------------------------

    def _master_side(self, role: Role, fence: IFence = OPEN) -> MasterSide:
        held = None
        if self._ha_port is not None and self._ha_gate is not None:
            held = (self._ha_port, self._ha_gate)
        side = MasterSide(
            self.reactor,
            self._ha_listen,
            self.store,
            sync=role is Role.SYNC_MASTER,
            config=self.config,
            peer_policy=self._peer_policy,
            in_sync_replicas=self.in_sync_replicas,
            min_in_sync_replicas=self.min_in_sync_replicas,
            slave_fallbehind_max=self.slave_fallbehind_max,
            slave_timeout=self.slave_timeout,
            replication_wait=self.replication_wait,
            limited=self.limited,
            held=held,
            auth=self.group_auth,
            fence=fence,
            # A put's wait fires with its result, counted (see Broker.put).
            finish=self._result,
        )
        return side

    def _replica(self, master_endpoint: str | IStreamClientEndpoint) -> Replica:
        return Replica(
            self.reactor,
            self.store,
            master_endpoint,
            config=self.config,
            retry_policy=self._retry_policy,
            max_unflushed=self._max_unflushed,
            on_divergence=self._on_divergence,
            probe_timeout=self._probe_timeout,
            master_kind=self._master_kind,
            replica_id=self._replica_id,
            epochs=self.epochs,
            expected_leader=self.roles.leader,
            max_cut=self.max_cut if self.epochs is not None else None,
            auth=self.group_auth,
        )

    def become_master(
        self, role: Role = Role.ASYNC_MASTER, *, epoch: int | None = None, fence: IFence = OPEN
    ) -> Deferred[None]:
        """
        Switch this running broker to master (C{role}) on the same open
        store: replication stops, an incomplete record at the log's tail
        (one still arriving from the old master) is dropped, and the HA
        port is listened on.

        @param epoch: the epoch this broker was elected in (failover): the
            log is flushed up to its max offset, then C{(epoch, max
            offset)} is added to the epoch file, before the HA port
            listens (also when it is a master already: a re-election).
        @param fence: failover: whether the master may take and
            acknowledge puts, and whose acks count -- what its coordinator
            writes (L{rmqha.ha.fence.Fence}); the master side is built
            with it (a re-election keeps the first one).
        @raise ValueError: an epoch without an epoch file.
        @raise ListenFailed: (asynchronously) the HA port could not be had;
            the broker is then a master without slaves (puts work).
        @raise OSError: (asynchronously) the log could not be flushed or
            the epoch file written: the broker is then not a master.
        """
        if not role.is_master:
            raise ValueError(f"{role.value} is not a master role")
        if not self.running:
            raise RuntimeError("the broker is not running: give the role to its constructor")
        if epoch is not None and self.epochs is None:
            raise ValueError(f"epoch {epoch} given to a broker without an epoch file")
        return self.roles.promote(role, epoch, fence)

    def _prepare_promotion(self, from_master: bool, epoch: int | None) -> Deferred[None]:
        """
        The role machine's promotion steps before the master side starts:
        an incomplete record at the log's tail (one still arriving from the
        old master) is dropped, then the epoch recorded.
        """
        if not from_master:
            self.commitlog.discard_incomplete_record()
        return self._record_epoch(epoch)

    def _start_master_side(self, side: MasterSide) -> None:
        side.open(self.commitlog, self.epochs)
        side.startService()

    def _record_epoch(self, epoch: int | None) -> Deferred[None]:
        """
        Flush the log up to its max offset, then add C{(epoch, max offset)}
        to the epoch file (nothing for C{None}).  The entry must never
        name bytes a crash could lose (docs/failover.md).
        """
        if epoch is None:
            return succeed(None)
        epochs = self.epochs
        assert epochs is not None
        commitlog = self.commitlog
        start = commitlog.max_offset

        def flushed(_: object, tries: int) -> Deferred[None] | None:
            if commitlog.flushed_offset < start:
                if tries == 0:
                    raise OSError(
                        f"cannot take epoch {epoch}: the commit log is flushed up to "
                        f"{commitlog.flushed_offset}, not to its max offset {start}"
                    )
                # (The flush that was running may have ended short of it.)
                return self.store.flush_now(thorough=True).addCallback(flushed, tries - 1)
            epochs.append(epoch, start)
            self._log.info(
                "epoch {epoch} starts at offset {start}", epoch=epoch, start=start
            )
            return None

        return self.store.flush_now(thorough=True).addCallback(flushed, 1)

    def become_slave(
        self,
        master_endpoint: str | IStreamClientEndpoint,
        leader: tuple[str, int] | None = None,
    ) -> Deferred[None]:
        """
        Switch this running broker to a slave of C{master_endpoint} on the
        same open store: the HA port closes, its slaves are disconnected,
        puts still waiting for replicas end with C{SLAVE_NOT_AVAILABLE}
        (they are stored), and replication starts with the usual checks.

        @param leader: failover: the node id and epoch the coordinator
            names as leader (a master answering another epoch is not
            followed).
        """
        if not self.running:
            raise RuntimeError("the broker is not running: give the role to its constructor")
        return self.roles.follow(master_endpoint, leader)

    def stand_by(self) -> Deferred[None]:
        """
        Be neither a master nor a replicating slave (failover mode: no
        master is known, or this master has lost its lease): the HA port
        closes, its slaves are disconnected, waiting puts end with
        C{SLAVE_NOT_AVAILABLE}, and puts are refused until a role is given.
        """
        return self.roles.stand_by()

    # -- start and stop -------------------------------------------------------

    def privilegedStartService(self) -> None:
        # twistd calls this before it drops privileges: the ports then.
        MultiService.privilegedStartService(self)
        self._listen()

    def startService(self) -> None:
        # The ports first: one that cannot be had stops the broker before
        # the store is opened (no abort marker, no store directory).
        self._listen()
        try:
            self.store.startService()
        except BaseException:
            self._stop_listening()
            raise
        self.scrub.startService()
        # (Not MultiService's: the store and the scrub are started.)
        Service.startService(self)
        if self._coordinated and self.group_auth is None:
            self._log.warn(INSECURE_GROUP_WARNING)
        side = self.roles.service
        endpoint = self.roles.endpoint
        if isinstance(side, MasterSide):
            side.open(self.commitlog, self.epochs)
        elif endpoint is not None:
            side = self._replica(endpoint)
        else:
            side = None  # (standing by: a coordinator gives the role)
        self.roles.started(side, endpoint)
        if side is not None:
            side.startService()
        if self._ha_port is not None:
            self._ha_port.startService()
        for port in self._ports():
            port.startService()

    def _listen(self) -> None:
        """
        Listen on the HA port (a master) and the admin HTTP port, once,
        each behind the connection limiter.

        @raise ListenFailed: naming the port and why (nothing is left
            listening).
        """
        if self._listening:
            return
        self._listening = True
        self._start_limits()
        try:
            if self._coordinated:
                # Failover: the HA port is this node's for its whole life,
                # in every role, so nothing else can bind it while it is a
                # slave; a port in use stops the node now, not at the
                # election.
                self._hold_ha_port()
            if self.role.is_master:
                side = self.roles.service = self._master_side(self.role)
                side.listen()
            for port in self._ports():
                port.listen(self.limited)
        except ListenFailed:
            self._stop_listening()
            raise

    def _hold_ha_port(self) -> None:
        if isinstance(self._ha_listen, str):
            warning = exposure_warning(self._ha_listen)
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
        gate = self._ha_gate = HAGate(self.reactor, self._not_master_why)
        self._ha_port = listen(self.reactor, "ha", self._ha_listen, self.limited("HA", gate))

    def _not_master_why(self) -> str:
        """
        What this node's HA port tells an rmqha peer while it is not the
        master.
        """
        if self.roles.state is RoleState.SLAVE:
            return f"this node is not the master: it is a slave of {self.master_endpoint}"
        return "this node is not the master: it stands by (no master elected yet)"

    def _stop_listening(self) -> None:
        side, self.roles.service = self.roles.service, None
        if side is not None:
            side.stopService()
        held, self._ha_port = self._ha_port, None
        if held is not None:
            held.stopService()
        for port in self._ports():
            port.stopService()
        self._listening = False

    def _start_limits(self) -> None:
        """
        Raise the open-files limit and size the connection budget all
        ports share: the soft limit less a reserve for the store.
        """
        soft = self._fd_limit()
        budget = self.connection_budget = ConnectionBudget.for_fd_limit(soft)
        ports = (1 if self.role.is_master or self._coordinated else 0) + len(self._ports())
        if ports * self.max_connections > budget.total:
            self._log.warn(
                "max-connections {max} on {ports} port(s) exceeds what the open-files "
                "limit {soft} allows with {reserve} kept for the store: at most {total} "
                "connections in all",
                max=self.max_connections,
                ports=ports,
                soft=soft,
                reserve=FD_RESERVE,
                total=budget.total,
            )

    def _ports(self) -> list[Port]:
        """
        The ports composed into this broker (L{rmqha._ports.Port} children:
        the admin interface).
        """
        return [s for s in self if isinstance(s, Port)]

    def limited(self, name: str, factory: Any) -> LimitedFactory:
        """
        C{factory} behind the connection limiter of the port C{name},
        sharing this broker's descriptor budget with its other ports.
        """
        limited = LimitedFactory(
            factory,
            self.reactor,
            name=name,
            max_connections=self.max_connections,
            max_per_peer=self.max_connections_per_peer,
            budget=self.connection_budget,
        )
        self.port_limits[name] = limited
        return limited

    def stopService(self) -> Deferred[None]:
        """
        Stop the admin interface, then the role, then the scrub (it reads
        the store's files), then close the store cleanly.
        """
        Service.stopService(self)
        held, self._ha_port = self._ha_port, None
        self._listening = False
        d: Deferred[Any] = succeed(None)
        for service in [*self._ports(), held]:
            if service is not None:
                d.addBoth(_stop_after, service)
        # (The role last: a change under way finishes its step first.)
        d.addBoth(lambda _: self.roles.stop())
        d.addBoth(lambda _: self.scrub.stopService())
        d.addBoth(lambda _: self.store.stopService())
        return d

    # -- what embedders see -------------------------------------------------

    @property
    def commitlog(self) -> CommitLog:
        commitlog = self.store.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return commitlog

    @property
    def master_factory(self) -> MasterFactory | None:
        """
        On a running master, its L{MasterFactory}.
        """
        side = self.role_service
        return side.factory if isinstance(side, MasterSide) else None

    @property
    def ha_service(self) -> IService | None:
        """
        The HA port's service (a master) or the connection to the master
        (a slave).
        """
        side = self.role_service
        if isinstance(side, MasterSide):
            return side.port
        return side.client_service if side is not None else None

    @property
    def problem(self) -> str | None:
        """
        On a slave, why it is not replicating; on a master, why it refuses
        every put (its commit log found a segment file changed under it);
        or C{None}.
        """
        side = self.role_service
        if isinstance(side, Replica):
            return side.problem
        commitlog = self.store.commitlog
        if commitlog is not None and commitlog.damage is not None:
            return f"the commit log is damaged: {commitlog.damage}; puts are refused"
        return None

    @property
    def master_endpoint(self) -> str | None:
        """
        On a slave, the master's endpoint description.
        """
        return self.roles.endpoint_text()

    def slaves(self) -> list[SlaveStatus]:
        """
        On a master, the status of each connected slave.
        """
        factory = self.master_factory
        return factory.slaves() if factory is not None else []

    # -- puts ---------------------------------------------------------------

    def put(self, message: Message) -> Deferred[PutMessageResult]:
        """
        Store C{message} on this master and replicate it.

        On an ASYNC_MASTER the result is C{PUT_OK} at once.  On a
        SYNC_MASTER: C{IN_SYNC_REPLICAS_NOT_ENOUGH} or
        C{SLAVE_NOT_AVAILABLE} at once when too few slaves are connected and
        within C{haSlaveFallbehindMax}; otherwise C{PUT_OK} when
        C{inSyncReplicas - 1} distinct slaves have acknowledged the put's
        end offset, or C{FLUSH_SLAVE_TIMEOUT} after C{slaveTimeout}.  The
        message is stored in every case.

        @raise NotMasterError: this broker is a slave (nothing is stored).
        @raise NotStoredError: the store could not take the message
            (C{CREATE_MAPEDFILE_FAILED}: no new segment, the disk is full;
            C{UNKNOWN_ERROR}: another I/O error); nothing is stored and
            the next put goes where this one would have.
        @raise MessageRejected: the message breaks a limit (nothing stored).
        """
        side = self.role_service
        if not isinstance(side, MasterSide) or side.factory is None:
            self.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE] += 1
            raise NotMasterError("messages are put on the master, this is a slave")
        refusal = side.fence.refusing()
        if refusal is not None:
            self.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE] += 1
            raise NotMasterError(refusal)
        too_few = side.ha.refusal()
        if too_few is not None:
            self.put_statuses[PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH] += 1
            raise NotStoredError(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, too_few)
        commitlog = self.commitlog
        try:
            append = commitlog.put(message)
        except OSError as e:
            raise self._not_stored(e) from e
        if self._store_failing:
            self._store_failing = False
            self._log.info("the commit log takes puts again")
        self.puts += 1
        self.put_bytes += append.size
        end = append.next_offset
        if commitlog.flush_disk_type is not FlushDiskType.SYNC_FLUSH:
            # The replicas' verdict, as the put's result (made by _result,
            # with no callback of its own).
            return side.wait_for(end, append)
        # Disk and replicas are waited for at the same time; the disk's
        # verdict comes first, as in RocketMQ's asyncPutMessage.
        flushed: Deferred[PutStatus] = self.store.when_flushed(end).addCallback(
            lambda _: PutStatus.PUT_OK
        )
        flushed.addTimeout(
            self.sync_flush_timeout,
            self.reactor,
            onTimeoutCancel=timed_out_as(PutStatus.FLUSH_DISK_TIMEOUT),
        )
        waits = [flushed, side.wait_for(end)]
        return gatherResults(waits).addCallback(
            lambda statuses: self._result(
                next((s for s in statuses if s is not PutStatus.PUT_OK), PutStatus.PUT_OK),
                append,
            )
        )

    def _not_stored(self, error: OSError) -> NotStoredError:
        """
        What a put that failed in the store answers; logged once until a
        put succeeds again (a full disk fails every put).
        """
        if isinstance(error, SegmentCreateError):
            status = PutStatus.CREATE_MAPEDFILE_FAILED
        else:
            status = PutStatus.UNKNOWN_ERROR
        self.put_statuses[status] += 1
        cause = "disk full: " if error.errno in _DISK_FULL else ""
        what = error.strerror or str(error)
        if error.filename:
            what = f"{error.filename}: {what}"
        text = f"{cause}{what}; the message was not stored"
        if not self._store_failing:
            self._store_failing = True
            self._log.error("puts fail: {why} ({status})", why=text, status=status.value)
        return NotStoredError(status, text, error.errno)

    def _result(self, status: PutStatus, append: AppendResult) -> PutMessageResult:
        self.put_statuses[status] += 1
        return PutMessageResult(status, append)

    def ha_address(self) -> Deferred[Any]:
        """
        On a master, fires with the address the HA port listens on (for
        C{tcp:0}).
        """
        assert isinstance(self.ha_service, StreamServerEndpointService)
        d = self.ha_service._waitingForPort
        assert d is not None
        return d.addCallback(lambda port: port.getHost())
