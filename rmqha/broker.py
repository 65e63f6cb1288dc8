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

from typing import Any, Callable, Sequence

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from rmqha._limits import raise_fd_limit
from rmqha._ports import ListenFailed, listened_address
from rmqha.store._record import Message
from rmqha.store._batch import AppendResult
from rmqha.store.commitlog import CommitLog
from rmqha.ha.config import DEFAULT_MAX_UNFLUSHED, Role
from rmqha.ha.auth import GroupAuth
from rmqha.ha.epochs import EpochFile
from rmqha.ha.fence import OPEN
from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.ha.interfaces import IFence
from rmqha.ha.master import MasterFactory, SlaveStatus
from rmqha.ha.masterside import MasterSide
from rmqha.ha.replica import Replica, ReplicaState
from rmqha.ha.roles import RoleMachine, RoleState
from rmqha.listening import BrokerPorts
from rmqha.puts import NotMasterError, NotStoredError, PutPath
from rmqha.remoting.metadata import BrokerMetadata, MetadataError, MetadataFlusher
from rmqha.remoting.registration import NameServerRegistration
from rmqha.remoting.registration import for_broker as registration_for
from rmqha.remoting.registration import start_for_broker as start_registration
from rmqha.remoting.sync import MetadataSync
from rmqha.roleservices import RoleServices, default_max_cut
from rmqha.store.scrub import ScrubService
from rmqha.store.service import CommitLogService
from rmqha.settings import BrokerSettings

__all__ = [
    "Role",
    "Broker",
    "NotStoredError",
    "NotMasterError",
    "ListenFailed",
    "DEFAULT_MAX_UNFLUSHED",
    "INSECURE_GROUP_WARNING",
    "default_max_cut",
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


class Broker(MultiService):
    """
    One broker, composed of its parts, each built here once: the store
    (L{CommitLogService}), the scrub, the ports (L{BrokerPorts}), the put
    path (L{PutPath}), the role (L{RoleMachine}, whose services
    L{RoleServices} builds).  docs/embedding.md shows it in use.
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
        @param settings: every user setting (its C{ha_listen} and
            C{master_endpoint} may be endpoints: L{rmqha.tls}).
        @param open_commitlog: opens the store (in C{startService}).
        @param coordinated: a failover coordinator gives the role (default:
            whether C{settings.coordinator} is set): it starts standing by.
        @param retry_policy: a slave's delay before its Nth reconnection.
        @param run_in_thread: runs the store's disk work (default: threads).
        @param fd_limit: raises the open-files limit, returns the soft one.
        @param epochs: the store's epoch file (failover), or C{None}.
        @param group_auth: failover: how node ids are proven (C{None}:
            only declared, warned about).
        """
        MultiService.__init__(self)
        self.settings = settings
        self.reactor = reactor
        self._coordinated = settings.failover if coordinated is None else coordinated
        self.store = CommitLogService(
            open_commitlog, reactor, flush_interval=settings.flush_interval,
            run_in_thread=run_in_thread,
        )
        self.ports = BrokerPorts(
            reactor, self, max_connections=settings.max_connections,
            max_connections_per_peer=settings.max_connections_per_peer, fd_limit=fd_limit,
        )
        self.put_path = PutPath(reactor, self.store, settings.sync_flush_timeout)
        self.role_services = RoleServices(
            reactor, settings, self.store, self.ports, self.put_path,
            retry_policy=retry_policy, epochs=epochs, group_auth=group_auth,
        )
        self.roles = RoleMachine(
            self.role_services, Role.SLAVE if self._coordinated else settings.role, reactor
        )
        self.roles.endpoint = settings.master_address
        #: The background scrub of the store (docs/store.md, "Scrub").
        self.scrub = ScrubService(
            lambda: self.store.commitlog, reactor, rate=settings.scrub_rate,
            slave=lambda: self.roles.is_slave,
        )
        #: The slave's metadata sync (L{attach_metadata_sync}), or C{None}.
        self.metadata_sync: MetadataSync | None = None
        #: The sync is the broker's own (made at start for --master-remoting).
        self._own_sync = False
        self.roles.listeners.append(self._role_state)
        #: The registration with --namesrv's NameServers (docs/remoting.md,
        #: "NameServers"), or C{None}.
        self.registration: NameServerRegistration | None = None
        if settings.namesrv:
            self.registration = registration_for(self, reactor)
        for name, part in (("store", self.store), ("scrub", self.scrub)):
            part.setName(name)  # type: ignore[no-untyped-call]
            part.setServiceParent(self)  # type: ignore[no-untyped-call]
        self._metadata: BrokerMetadata | None = None
        #: Writes the metadata's offsets every 5 s and at stop, while running.
        self.metadata_flusher: MetadataFlusher | None = None
        if settings.listen is not None:
            from rmqha.remoting.broker import RemotingPort, vip_endpoint

            remoting = RemotingPort(self, settings.listen)
            remoting.setServiceParent(self)  # type: ignore[no-untyped-call]
            # RocketMQ's second port on listenPort - 2 (docs/remoting.md).
            vip = vip_endpoint(settings.listen)
            if vip is not None:
                RemotingPort(self, vip, vip=remoting).setServiceParent(self)  # type: ignore[no-untyped-call]

    @property
    def metadata(self) -> BrokerMetadata:
        """
        The store's RocketMQ metadata (C{<store>/config/*.json}: topics,
        consumer and delay offsets, subscription groups), loaded when the
        broker starts: read it through the broker at each use (a new
        object at each start).

        @raise RuntimeError: the broker has not started.
        """
        if self._metadata is None:
            raise RuntimeError("the broker is not running: its metadata is not loaded")
        return self._metadata

    def attach_metadata_sync(self, sync: MetadataSync) -> None:
        """
        Run C{sync} (on this broker's L{rmqha.remoting.metadata.BrokerMetadata})
        while the broker runs: it syncs while the role is a replicating
        slave's, stops at any role change, and is told the master's
        remoting address of C{--master-remoting} if given (a NameServer's
        C{masterAddr} may replace it later:
        L{MetadataSync.set_master_address}).  Call it before or after
        starting the broker.  It replaces the sync a broker given
        C{--master-remoting} made for itself.
        """
        if self.metadata_sync is not None and self._own_sync:
            # (The broker's own, for --master-remoting: the given one
            # replaces it.)
            own, self.metadata_sync, self._own_sync = self.metadata_sync, None, False
            if own.running:
                own.stopService()
        if self.metadata_sync is not None:
            raise ValueError("a metadata sync is attached already")
        self.metadata_sync = sync
        if self.settings.master_remoting is not None:
            sync.set_master_address(self.settings.master_remoting)
        sync.set_slave(bool(self.running) and self.roles.state is RoleState.SLAVE)
        if self.running:
            sync.startService()

    def _role_state(self, state: RoleState) -> None:
        if self.metadata_sync is not None:
            self.metadata_sync.set_slave(state is RoleState.SLAVE)

    @property
    def role(self) -> Role:
        """The role in effect (L{RoleMachine.role})."""
        return self.roles.role

    @property
    def role_service(self) -> MasterSide | Replica | None:
        """The running L{MasterSide} or L{Replica} (L{RoleMachine.service})."""
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
        commitlog = self.store.commitlog
        return commitlog is not None and commitlog.damage is not None

    def become_master(
        self, role: Role = Role.ASYNC_MASTER, *, epoch: int | None = None, fence: IFence = OPEN
    ) -> Deferred[None]:
        """
        Switch this running broker to master (C{role}) on the same open
        store: see L{RoleMachine.promote}.

        @raise ValueError: an epoch without an epoch file.
        @raise ListenFailed: (asynchronously) the HA port could not be had:
            a master without slaves (puts work).
        @raise OSError: (asynchronously) the epoch could not be recorded.
        """
        if not role.is_master:
            raise ValueError(f"{role.value} is not a master role")
        self._check_running()
        if epoch is not None and self.role_services.epochs is None:
            raise ValueError(f"epoch {epoch} given to a broker without an epoch file")
        return self.roles.promote(role, epoch, fence).addCallback(self._register_role)

    def become_slave(
        self, master_endpoint: str | IStreamClientEndpoint, leader: tuple[str, int] | None = None
    ) -> Deferred[None]:
        """
        Switch this running broker to a slave of C{master_endpoint} on the
        same open store: see L{RoleMachine.follow}.
        """
        self._check_running()
        return self.roles.follow(master_endpoint, leader).addCallback(self._register_role)

    def stand_by(self) -> Deferred[None]:
        """
        Be neither a master nor a replicating slave (failover mode): see
        L{RoleMachine.stand_by}.
        """
        return self.roles.stand_by().addCallback(self._register_role)

    def _register_role(self, result: None) -> None:
        # A new role is registered at once, not after the next period: a
        # master as brokerId 0, anything else with its --broker-id.
        if self.registration is not None:
            broker_id = 0 if self.roles.role.is_master else self.settings.broker_id
            self.registration.role_changed(broker_id)

    def _topics_changed(self, version: object) -> None:
        # A master's changed topic table goes to the NameServers at once
        # (one round per reactor turn), as 4.9.8 after creating a topic.
        if self.registration is not None and self.roles.role.is_master:
            self.registration.topics_changed()

    def namesrv_master_addr(self, address: str | None) -> None:
        """
        The master's remoting address from the NameServers' newest answer
        (C{None}: none known), for the metadata sync, as RocketMQ's
        C{slaveSynchronize.setMasterAddr}.
        """
        if self.metadata_sync is not None:
            self.metadata_sync.set_master_address(address)

    def follow_namesrv_master(self, ha_server_addr: str) -> Deferred[None] | None:
        """
        A slave started without C{--master} follows the master's HA address
        its NameServers name, and re-points when it changes (RocketMQ's
        C{updateMasterHAServerAddrPeriodically}); over TLS with
        C{--tls-ca}.  Nothing while the broker is not running.
        """
        if not self.running:
            return None
        from rmqha.settings import master_description, parse_host_port
        from rmqha.tls import client_endpoint

        host, port = parse_host_port(ha_server_addr, "haServerAddr")
        files = self.settings.tls_files
        endpoint: str | IStreamClientEndpoint = (
            client_endpoint(self.reactor, host, port, files, self.settings.tls_server_name)
            if files.ca is not None
            else master_description(host, port)
        )
        self._log.info("following the master the NameServers name: {ha}", ha=ha_server_addr)
        return self.become_slave(endpoint)

    def _check_running(self) -> None:
        if not self.running:
            raise RuntimeError("the broker is not running: give the role to its constructor")

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
            self.ports.shut(self.roles)
            raise
        try:
            self._metadata = BrokerMetadata.load(self.commitlog.store_dir, self.reactor)
        except (MetadataError, OSError):
            self.ports.shut(self.roles)
            self.store.stopService()
            raise
        # The topics and groups a genuine broker has before its files load
        # over them (TBW102, the cluster's and the broker's own topic, the
        # tools' groups): a file's entry wins, nothing is written for them.
        from rmqha.remoting.metadata import builtin_groups, builtin_topics
        from rmqha.remoting.registration import default_broker_name

        self._metadata.add_builtins(
            builtin_topics(
                self.settings.cluster,
                self.settings.group or default_broker_name(),
                auto_create_topic_enable=self.settings.auto_create_topic_enable,
            ),
            builtin_groups(),
        )
        self._metadata.topic_listeners.append(self._topics_changed)
        self.metadata_flusher = MetadataFlusher(self._metadata, self.reactor)
        self.metadata_flusher.startService()
        if (self.settings.master_remoting is not None or self.settings.namesrv) and (
            self.metadata_sync is None or self._own_sync
        ):
            # --master-remoting (or the NameServers' masterAddr): the sync
            # of this start's metadata (a new object at each start), over
            # plain TCP.
            from rmqha.remoting.sync import FIRST_DELAY, remoting_client

            # (Failover: the first sync as soon as this node follows a
            # master, not 3 s later as 4.9.8's: a node elected in between
            # would serve the consumer offsets of its own last run.)
            self.attach_metadata_sync(
                MetadataSync(
                    self._metadata,
                    self.reactor,
                    remoting_client(self.reactor),
                    first_delay=0.0 if self.settings.failover else FIRST_DELAY,
                )
            )
            self._own_sync = True
            if self.registration is not None and self.settings.master_remoting is None:
                # (A restart: the address the NameServers gave before.)
                self.namesrv_master_addr(self.registration.master_addr)
        self.scrub.startService()
        # (Not MultiService's: the store and the scrub are started.)
        Service.startService(self)
        if self._coordinated and self.role_services.group_auth is None:
            self._log.warn(INSECURE_GROUP_WARNING)
        side = self.roles.service
        endpoint = self.roles.endpoint
        if isinstance(side, MasterSide):
            side.open(self.commitlog, self.role_services.epochs)
        elif endpoint is not None:
            side = self.role_services.replica(endpoint, self.roles.leader)
        else:
            side = None  # (standing by: a coordinator gives the role)
        self.roles.started(side, endpoint)
        if side is not None:
            side.startService()
        self.ports.start()
        if self.metadata_sync is not None:
            self.metadata_sync.startService()
        start_registration(self)
        from rmqha.startup import startup_line

        self._log.info("{line}", line=startup_line(self))

    def _listen(self) -> None:
        ports, settings = self.ports, self.settings
        ports.open(self.roles, self.role_services, hold_ha_port=self._coordinated,
                   ha_listen=settings.ha_listen)

    def stopService(self) -> Deferred[None]:
        """
        Unregister from the NameServers, stop the ports, then the role,
        then the scrub (it reads the store's files), then close the store
        cleanly.
        """
        Service.stopService(self)
        d: Deferred[Any] = succeed(None)
        if self.registration is not None and self.registration.running:
            # (Unregistered first: clients stop being sent here.)
            d = self.registration.stopService()
        if self.metadata_sync is not None and self.metadata_sync.running:
            d.addBoth(_stop_after, self.metadata_sync)
        for service in self.ports.close():
            d.addBoth(_stop_after, service)
        # (The role last: a change under way finishes its step first.)
        d.addBoth(lambda _: self.roles.stop())
        d.addBoth(lambda _: self._stop_flusher())
        d.addBoth(lambda _: self.scrub.stopService())
        d.addBoth(lambda _: self.store.stopService())
        return d

    def _stop_flusher(self) -> None:
        # (Writes what is dirty: the consumer and delay offsets.)
        flusher, self.metadata_flusher = self.metadata_flusher, None
        if flusher is not None and flusher.running:
            flusher.stopService()

    @property
    def commitlog(self) -> CommitLog:
        commitlog = self.store.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return commitlog

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
        """On a slave, the master's endpoint description."""
        return self.roles.endpoint_text()

    @property
    def master_factory(self) -> MasterFactory | None:
        """On a running master, its L{MasterFactory}."""
        side = self.role_service
        return side.factory if isinstance(side, MasterSide) else None

    @property
    def ha_service(self) -> IService | None:
        """The HA port's service (a master), or the connection to the master."""
        side = self.role_service
        if isinstance(side, MasterSide):
            return side.port
        return side.client_service if side is not None else None

    def slaves(self) -> list[SlaveStatus]:
        """On a master, the status of each connected slave."""
        factory = self.master_factory
        return factory.slaves() if factory is not None else []

    def ha_address(self) -> Deferred[Any]:
        """On a master, fires with the address its HA port listens on."""
        assert isinstance(self.ha_service, StreamServerEndpointService)
        return listened_address(self.ha_service)

    def put(self, message: Message) -> Deferred[PutMessageResult]:
        """
        Store C{message} on this master and replicate it: see
        L{PutPath.put} for what its result and errors say.
        """
        return self.put_path.put(self.roles.service, message)

    def put_then(
        self, message: Message, answer: Callable[[PutMessageResult], object]
    ) -> PutMessageResult | None:
        """
        L{put} without a L{Deferred}: the result if known now, else
        C{None} and C{answer(result)} later; see L{PutPath.put_then}.
        """
        return self.put_path.put_then(self.roles.service, message, answer)

    def put_batch(self, messages: Sequence[Message]) -> Deferred[tuple[PutStatus, list[AppendResult]]]:
        """
        Store C{messages} on this master as one batch (all or nothing) and
        replicate them: see L{PutPath.put_batch}.
        """
        return self.put_path.put_batch(self.roles.service, messages)
