# -*- test-case-name: tests.test_broker -*-
"""
A broker: the commit log plus its HA role, as one service tree.

    master:  CommitLogService + StreamServerEndpointService(MasterFactory)
    slave:   CommitLogService + ClientService(SlaveFactory)

The HA half is built when the store has been opened (the store opens in
C{startService}, after twistd has daemonised), so the protocols always
work on an open log.  This is also the embedding API: build a L{Broker}
with a reactor, start it, and L{Broker.put} messages on a master.
"""

from __future__ import annotations

import bisect
import enum
import errno
import os
import time
from typing import Any, Callable

from twisted.application.internet import StreamServerEndpointService, backoffPolicy
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.endpoints import clientFromString, serverFromString
from twisted.internet.interfaces import (
    IDelayedCall,
    IStreamClientEndpoint,
    IStreamServerEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.commitlog import (
    AppendResult,
    CommitLog,
    FlushDiskType,
    Message,
    SegmentCreateError,
)
from rmqha.ha.control import CheckFailed, MasterUnreachable, probe
from rmqha.ha.divergence import (
    Divergence,
    find_divergence,
    read_master_kind,
    write_master_kind,
)
from rmqha.ha.group import GroupTransferService, PutMessageResult, PutStatus, timed_out_as
from rmqha.ha.config import (
    DEFAULT_HA_CONFIG,
    DEFAULT_HA_LISTEN,
    DEFAULT_IN_SYNC_REPLICAS,
    DEFAULT_MASTER_KIND,
    DEFAULT_MAX_UNFLUSHED,
    DEFAULT_MIN_IN_SYNC_REPLICAS,
    DEFAULT_ON_DIVERGENCE,
    DEFAULT_PROBE_TIMEOUT,
    DEFAULT_SLAVE_FALLBEHIND_MAX,
    DEFAULT_SLAVE_TIMEOUT,
    DEFAULT_SYNC_FLUSH_TIMEOUT,
    PROBE_FIRST_TIMEOUT,
    HAConfig,
    MasterKind,
    OnDivergence,
    Role,
)
from rmqha.ha.master import MasterFactory, SlaveStatus
from rmqha._limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    FD_RESERVE,
    ConnectionBudget,
    LimitedFactory,
    raise_fd_limit,
)
from rmqha.ha._wire import FEATURE_IDENTIFY
from rmqha.ha.slave import SlaveFactory, load_replica_id, make_slave_service
from rmqha.scrub import DEFAULT_SCRUB_RATE, ScrubService
from rmqha.storeservice import DEFAULT_FLUSH_INTERVAL, CommitLogService
from rmqha.tls import (
    PeerPolicy,
    admin_exposure_warning,
    exposure_warning,
    plain_master_warning,
    split_description,
)

__all__ = [
    "Role",
    "Broker",
    "NotStoredError",
    "NotMasterError",
    "ListenFailed",
    "DEFAULT_MAX_UNFLUSHED",
]



def _stop_child(_: object, service: IService) -> Deferred[None]:
    stopping = service.stopService()
    d: Deferred[Any] = stopping if isinstance(stopping, Deferred) else succeed(None)
    return d.addBoth(lambda _: service.disownServiceParent())


#: Upper bounds (seconds) of the replication-wait histogram's buckets.
REPLICATION_WAIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0,
)


class Histogram:
    """
    Counts of observations per cumulative bucket, plus their sum (what a
    Prometheus histogram exposes).
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


#: OS errors meaning the disk (or the user's quota) is full.
_DISK_FULL = frozenset([errno.ENOSPC, errno.EDQUOT])


def _enum(kind: Any, value: Any, what: str) -> Any:
    """
    C{value} as a member of the string enum C{kind} (C{None} stays).

    @raise ValueError: naming C{what} and the values allowed.
    """
    if value is None and kind is OnDivergence:
        return None
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ValueError(f"{what} {value!r} is not one of {allowed}") from None


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


class ListenFailed(Exception):
    """
    A port the broker serves could not be listened on (a bad endpoint
    description, the address in use, no permission).

    @ivar port: C{"ha"} or C{"http"}.
    @ivar description: the endpoint description.
    @ivar reason: one line saying why.
    """

    def __init__(self, port: str, description: str, reason: str) -> None:
        super().__init__(f"cannot listen on {description}: {reason}")
        self.port = port
        self.description = description
        self.reason = reason


class _Halt(Exception):
    """
    A check found something only an operator can fix (not a divergence):
    replication stays stopped; the text says what.
    """


class _NotAnswering(CheckFailed):
    """
    A master that must speak the rmqha extension did not answer it.
    """


class _OpenedLater(Factory):
    """
    What a port listens with before the store is open: builds the
    protocols of C{factory}, which is set when the store has opened (in
    the same C{startService} call, or under twistd before the reactor
    runs); a connection before that is closed at once.
    """

    factory: Factory | None = None
    noisy = False

    def logPrefix(self) -> str:
        return "MasterFactory"

    def buildProtocol(self, addr: Any) -> Any:
        if self.factory is None:
            return None  # (Twisted then closes the connection.)
        return self.factory.buildProtocol(addr)


class Broker(MultiService):
    """
    One broker.

    @ivar store: the L{CommitLogService}.
    @ivar master_factory: on a running master, its L{MasterFactory}.
    @ivar slave_factory: on a running slave, its L{SlaveFactory}.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        open_commitlog: Callable[[], CommitLog],
        role: Role,
        *,
        ha_listen: str | IStreamServerEndpoint = DEFAULT_HA_LISTEN,
        master_endpoint: str | IStreamClientEndpoint | None = None,
        peer_policy: PeerPolicy = PeerPolicy(),
        http: str | IStreamServerEndpoint | None = None,
        http_peer_policy: PeerPolicy | None = None,
        config: HAConfig = DEFAULT_HA_CONFIG,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        retry_policy: Callable[[int], float] | None = None,
        max_unflushed: int = DEFAULT_MAX_UNFLUSHED,
        in_sync_replicas: int = DEFAULT_IN_SYNC_REPLICAS,
        min_in_sync_replicas: int = DEFAULT_MIN_IN_SYNC_REPLICAS,
        slave_timeout: float = DEFAULT_SLAVE_TIMEOUT,
        slave_fallbehind_max: int = DEFAULT_SLAVE_FALLBEHIND_MAX,
        sync_flush_timeout: float = DEFAULT_SYNC_FLUSH_TIMEOUT,
        run_in_thread: Callable[[Callable[[], None]], Deferred[None]] | None = None,
        on_divergence: OnDivergence | str | None = DEFAULT_ON_DIVERGENCE,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
        fd_limit: Callable[[], int] = raise_fd_limit,
        scrub_rate: int = DEFAULT_SCRUB_RATE,
        master_kind: MasterKind | str = DEFAULT_MASTER_KIND,
    ) -> None:
        """
        @param ha_listen: the HA port (master): a Twisted server endpoint
            description, or an endpoint (L{rmqha.tls.server_endpoint} for
            TLS that can require client certificates).
        @param master_endpoint: the master's HA port (slave): a Twisted
            client endpoint description, or an endpoint
            (L{rmqha.tls.client_endpoint} for verified TLS).
        @param peer_policy: what a slave's TLS certificate must satisfy
            (master).
        @param http: the admin HTTP interface (L{rmqha.admin}): a Twisted
            server endpoint description (plain TCP beyond loopback is
            warned about), or an endpoint (L{rmqha.tls.server_endpoint}
            for TLS requiring client certificates), or C{None} for none.
        @param http_peer_policy: the names an admin client's TLS
            certificate must carry (L{rmqha.admin.make_site}).
        @param max_unflushed: a slave stops reading from its master while
            more received bytes than this are not on disk.
        @param in_sync_replicas: on a SYNC_MASTER, how many copies (the
            master's included) a put waits for: C{inSyncReplicas}, 2 being
            4.x's SYNC_MASTER.
        @param min_in_sync_replicas: fewer in-sync copies than this fail a
            put at once with C{IN_SYNC_REPLICAS_NOT_ENOUGH}.
        @param slave_timeout: C{slaveTimeout}, seconds.
        @param slave_fallbehind_max: C{haSlaveFallbehindMax}: a slave this
            far behind a put's end does not count as in sync.
        @param sync_flush_timeout: C{syncFlushTimeout}, seconds: with
            SYNC_FLUSH, a put not on disk by then is C{FLUSH_DISK_TIMEOUT}.
        @param run_in_thread: how the store runs its flushes (default: the
            reactor's thread pool; see L{CommitLogService}).
        @param on_divergence: what a slave does when its log has diverged
            from the master's (docs/reliability.md): C{"halt"} (stop
            replicating), C{"truncate"} (cut back to the last common
            offset), C{"rebootstrap"} (move the store aside, start afresh),
            or C{None} (no checks).
        @param max_connections: connections each listening port (HA,
            HTTP) accepts at once; more are closed at once.
        @param max_connections_per_peer: connections one host may hold on
            each port.
        @param fd_limit: called at start: raises the open-files limit and
            returns the soft limit; all ports together keep
            C{FD_RESERVE} descriptors of it free for the store.
        @param scrub_rate: bytes per second the background scrub re-reads
            and re-checks (L{rmqha.scrub}); 0 turns it off.
        @param probe_timeout: a slave's most seconds to wait for its
            master's answer to the control probe (docs/protocol.md).
        @param master_kind: a slave's master is C{"rmqha"} (never
            replicate classically), C{"rocketmq"} (no probe: classic at
            once) or C{"auto"} (probe; a master once seen speaking the
            extension is never taken for a RocketMQ one).
        """
        super().__init__()
        if role is Role.SLAVE and not master_endpoint:
            raise ValueError("a slave needs the master's address")
        self.reactor = reactor
        if not 1 <= min_in_sync_replicas <= in_sync_replicas:
            raise ValueError(
                f"minInSyncReplicas {min_in_sync_replicas} must be between 1 and "
                f"inSyncReplicas {in_sync_replicas}"
            )
        self.role = role
        self.config = config
        self.in_sync_replicas = in_sync_replicas
        self.min_in_sync_replicas = min_in_sync_replicas
        self.slave_fallbehind_max = slave_fallbehind_max
        self.sync_flush_timeout = sync_flush_timeout
        self.group = GroupTransferService(reactor, slave_timeout)
        #: How many puts ended with each status.
        self.put_statuses: dict[PutStatus, int] = {s: 0 for s in PutStatus}
        #: Seconds SYNC_MASTER puts waited for their slaves.
        self.replication_wait = Histogram(REPLICATION_WAIT_BUCKETS)
        self._ha_listen = ha_listen
        self._master_endpoint = master_endpoint
        self._peer_policy = peer_policy
        self._on_divergence = _enum(OnDivergence, on_divergence, "on-divergence")
        self._probe_timeout = probe_timeout
        self._master_kind_option = _enum(MasterKind, master_kind, "master kind")
        if self._master_kind_option is MasterKind.RMQHA and self._on_divergence is None:
            raise ValueError(
                "master kind rmqha needs the control probe, which on-divergence off turns off"
            )
        #: What the slave's master is: C{"rmqha"}, C{"rocketmq"}, or
        #: C{None} while unknown (remembered in the store).
        self.master_kind: str | None = None
        self._check_problem: str | None = None
        self._halted = False
        self._checking = False
        self.failed_checks = 0
        self._check_backoff = backoffPolicy(initialDelay=1.0, maxDelay=30.0)
        self._check_retry: IDelayedCall | None = None
        self._checked_framing: bool | None = None
        #: The replica id the slave declares (the master offered IDENTIFY).
        self._identity: str | None = None
        self._classic_logged = False
        self._master_client: Any = None
        #: The divergence replication is halted on, if any.
        self.divergence: Divergence | None = None
        #: Divergences found, by kind.
        self.divergences: dict[str, int] = {"ahead": 0, "behind": 0, "different": 0}
        self._retry_policy = retry_policy
        if max_connections < 1 or max_connections_per_peer < 1:
            raise ValueError(
                f"max-connections {max_connections} and max-connections-per-peer "
                f"{max_connections_per_peer} must be at least 1"
            )
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self._fd_limit = fd_limit
        #: The connection limiter of each listening port, by name.
        self.port_limits: dict[str, LimitedFactory] = {}
        self.connection_budget: ConnectionBudget | None = None
        self._http = http
        self._http_peer_policy = http_peer_policy
        self._max_unflushed = max_unflushed
        self.http_service: StreamServerEndpointService | None = None
        self._ha_factory: _OpenedLater | None = None
        self._listening = False
        self.store = CommitLogService(
            open_commitlog,
            reactor,
            flush_interval=flush_interval,
            run_in_thread=run_in_thread,
        )
        self.store.setName("store")
        self.store.setServiceParent(self)
        # Whether the last put failed in the store (logged once).
        self._store_failing = False
        #: The background scrub of the store (docs/store.md, "Scrub").
        self.scrub = ScrubService(
            lambda: self.store.commitlog, reactor, rate=scrub_rate,
            slave=role is Role.SLAVE,
        )
        self.scrub.setName("scrub")
        self.scrub.setServiceParent(self)
        #: Messages and bytes put on this master.
        self.puts = 0
        self.put_bytes = 0
        self.master_factory: MasterFactory | None = None
        self.slave_factory: SlaveFactory | None = None
        self.ha_service: IService | None = None

    def privilegedStartService(self) -> None:
        # twistd calls this before it drops privileges: the ports then.
        super().privilegedStartService()
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
        commitlog = self.store.commitlog
        assert commitlog is not None
        self.scrub.startService()
        if self.role.is_master:
            self.master_factory = MasterFactory(
                commitlog, self.reactor, self.config, self._peer_policy
            )
            self.master_factory.ack_listeners.append(self._acks_changed)
            assert self._ha_factory is not None and self.ha_service is not None
            self._ha_factory.factory = self.master_factory
            # MultiService starts every child; the store is already running.
            self.running = True
            self.ha_service.startService()
        else:
            assert self._master_endpoint is not None
            master = self._master_endpoint
            if isinstance(master, str):
                kind, positional, keywords = split_description(master)
                host = keywords.get("host") or (positional[0] if positional else "")
                warning = plain_master_warning(host) if kind == "tcp" else None
                if warning is not None:
                    self._log.warn("{text}", text=warning)
                master = clientFromString(self.reactor, master)
            self._master_client = master
            self.running = True
            self._build_slave_replication(commitlog)
            self._check_then_replicate()
        if self.http_service is not None:
            self.http_service.startService()

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
            if self.role.is_master:
                listen = self._ha_listen
                if isinstance(listen, str):
                    warning = exposure_warning(listen)
                    if warning is not None:
                        self._log.warn("{text}", text=warning)
                self._ha_factory = _OpenedLater()
                self.ha_service = self._listen_on(
                    "ha", listen, self._limited("HA", self._ha_factory)
                )
            if self._http is not None:
                from rmqha.admin import make_site

                if isinstance(self._http, str):
                    warning = admin_exposure_warning(self._http)
                    if warning is not None:
                        self._log.warn("{text}", text=warning)
                self.http_service = self._listen_on(
                    "http",
                    self._http,
                    self._limited("HTTP", make_site(self, peer_policy=self._http_peer_policy)),
                )
        except ListenFailed:
            self._stop_listening()
            raise

    def _listen_on(
        self, name: str, listen: str | IStreamServerEndpoint, factory: Any
    ) -> StreamServerEndpointService:
        description = listen if isinstance(listen, str) else str(listen)
        try:
            endpoint = serverFromString(self.reactor, listen) if isinstance(listen, str) else listen
            service = StreamServerEndpointService(endpoint, factory)
            # Twisted's way to have a failed listen raise here, not be logged.
            service._raiseSynchronously = True
            service.privilegedStartService()
        except Exception as e:
            socket_error = getattr(e, "socketError", None)
            why = (
                socket_error.strerror
                if isinstance(socket_error, OSError) and socket_error.strerror
                else str(e) or type(e).__name__
            )
            raise ListenFailed(name, description, why) from None
        service.setName(name)
        # A running parent would start it; startService does, in order.
        running, self.running = self.running, False
        service.setServiceParent(self)
        self.running = running
        return service

    def _stop_listening(self) -> None:
        for service in (self.ha_service, self.http_service):
            if service is not None:
                service.stopService()
                service.disownServiceParent()
        self.ha_service = self.http_service = None
        self._listening = False

    def _start_limits(self) -> None:
        """
        Raise the open-files limit and size the connection budget all
        ports share: the soft limit less a reserve for the store.
        """
        soft = self._fd_limit()
        budget = self.connection_budget = ConnectionBudget.for_fd_limit(soft)
        ports = (1 if self.role.is_master else 0) + (1 if self._http is not None else 0)
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

    def _limited(self, name: str, factory: Any) -> LimitedFactory:
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

    # -- the slave's replication and its divergence checks ------------------

    def _build_slave_replication(self, commitlog: CommitLog) -> None:
        if self.slave_factory is not None:
            self.store.flush_observers.remove(self.slave_factory.flushed)
        self.slave_factory = SlaveFactory(
            commitlog,
            self.reactor,
            self.config,
            max_unflushed=(
                None
                if commitlog.flush_disk_type is FlushDiskType.SYNC_FLUSH
                else self._max_unflushed
            ),
            request_flush=lambda: self.store.flush_now(thorough=True),
            on_suspect=self._suspect,
        )
        self.slave_factory.checked = bool(self._checked_framing)
        self.slave_factory.identity = self._identity
        self.store.flush_observers.append(self.slave_factory.flushed)
        self.ha_service = make_slave_service(
            self._master_client,
            self.slave_factory,
            self.reactor,
            self._retry_policy,
            master=self.master_address,
        )
        self.ha_service.setName("ha")
        # A running parent would start it at once; the divergence check
        # decides when it starts.
        running, self.running = self.running, False
        self.ha_service.setServiceParent(self)
        self.running = running

    def _suspect(self) -> None:
        """
        A connection ended before the master sent anything, or on an
        offset mismatch: check for divergence (replication keeps retrying
        meanwhile, with its back-off).
        """
        if self._may_check():
            self._check_then_replicate()

    def _may_check(self) -> bool:
        return bool(self.running) and not (
            self._checking or self.divergence is not None or self._halted
        )

    def _check_then_replicate(self) -> None:
        self._checking = True
        d = Deferred.fromCoroutine(self._check_divergence())
        d.addCallback(lambda found: Deferred.fromCoroutine(self._act_on(found)))

        def done(result: object) -> None:
            self._checking = False
            if isinstance(result, Failure):
                if result.check(_Halt):
                    self._halt(result.getErrorMessage())
                else:
                    self._check_failed(result)
            else:
                self.failed_checks = 0
                self._check_problem = None

        d.addBoth(done)

    def _halt(self, why: str) -> None:
        """
        Stop replicating for good (until a restart): only an operator can
        fix C{why}.
        """
        self._halted = True
        self._check_problem = why
        self._log.error("{why}; replication halted", why=why)
        service = self.ha_service
        if service is not None and service.running:
            service.stopService()

    def _check_failed(self, failure: Failure) -> None:
        """
        A check could not finish (the master unreachable, a control session
        lost or damaged, a master that spoke the extension not answering
        it): try again after a back-off.  Replication is left as it was:
        not started before a first check has finished.
        """
        self.failed_checks += 1
        delay = self._check_backoff(self.failed_checks - 1)
        master = self.master_address
        if failure.check(MasterUnreachable):
            why = f"cannot reach master {master}: {failure.getErrorMessage()}"
        elif failure.check(_NotAnswering):
            why = failure.getErrorMessage()
        else:
            why = f"checking master {master} failed: {failure.getErrorMessage()}"
            if not failure.check(CheckFailed):
                self._log.failure("checking the master", failure)
        self._check_problem = why
        self._log.warn("{why}; retrying in {delay:.1f} s", why=why, delay=delay)
        if self.running and self._check_retry is None:
            self._check_retry = self.reactor.callLater(delay, self._retry_check)

    def _retry_check(self) -> None:
        self._check_retry = None
        if self._may_check():
            self._check_then_replicate()

    @property
    def problem(self) -> str | None:
        """
        On a slave, why it is not replicating (its master unreachable, not
        answering, a segment size that differs), or C{None}.
        """
        if self._check_problem is not None:
            return self._check_problem
        factory = self.slave_factory
        if factory is not None and factory.connection is None and factory.connect_failure:
            return f"cannot reach master {self.master_address}: {factory.connect_failure}"
        return None

    @property
    def master_address(self) -> str:
        """
        On a slave, its master as C{HOST:PORT} (or its endpoint
        description when it has no host and port).
        """
        master = self.master_endpoint or ""
        if not isinstance(self._master_endpoint, str):
            return master  # (a TLS endpoint says "tls:HOST:PORT (verifying NAME)")
        kind, positional, keywords = split_description(master)
        host = keywords.get("host") or (positional[0] if positional else "")
        port = keywords.get("port") or (positional[1] if len(positional) > 1 else "")
        if kind == "tcp" and host and port:
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return master

    def _known_master_kind(self) -> str | None:
        if self.master_kind is None:
            self.master_kind = read_master_kind(self.commitlog.store_dir, self.master_address)
        return self.master_kind

    def _learnt(self, kind: str) -> None:
        """
        The master is C{kind}: remember it in the store when that is news.
        """
        if read_master_kind(self.commitlog.store_dir, self.master_address) != kind:
            try:
                write_master_kind(
                    self.commitlog.store_dir, self.master_address, kind, self.reactor.seconds()
                )
            except OSError as e:
                self._log.warn(
                    "cannot remember in the store that the master is {kind}: {error}",
                    kind=kind,
                    error=e,
                )
        self.master_kind = kind

    def _set_framing(self, checked: bool, identify: bool = False) -> None:
        """
        How the replication connection talks: checked framing or classic,
        and whether it declares this replica's id (the master takes
        IDENTIFY).
        """
        if self._checked_framing != checked:
            self._checked_framing = checked
            self._log.info(
                "checked framing (CRC-32 on every frame and report) {state}",
                state="on" if checked else "off: the master does not offer it",
            )
        self._identity = load_replica_id(self.commitlog.store_dir) if identify else None
        if self.slave_factory is not None:
            self.slave_factory.checked = checked
            self.slave_factory.identity = self._identity

    def _classic(self, why: str) -> None:
        self._set_framing(False)
        if not self._classic_logged:
            self._classic_logged = True
            self._log.warn(
                "{why}: replicating classically, without checked framing or "
                "divergence checks",
                why=why,
            )

    async def _check_divergence(self) -> Divergence | None:
        master = self.master_address
        if self._master_kind_option == "rocketmq":
            self._learnt("rocketmq")
            self._classic(f"master {master} is a RocketMQ master (--master-kind rocketmq)")
            return None
        if self._on_divergence is None:
            return None
        # Where this log ends, taken before the master's offsets are: the
        # master's max can only have grown since, so replication running
        # meanwhile cannot look like "ahead".
        slave_end = self.commitlog.record_end
        known = self._known_master_kind()
        sticky = known == "rmqha" or self._master_kind_option == "rmqha"
        # A master that must answer is given the whole probe timeout;
        # otherwise silence for the first timeout means RocketMQ.
        first = None if sticky else min(PROBE_FIRST_TIMEOUT, self._probe_timeout)
        session = await probe(
            self.reactor, self._master_client, self._probe_timeout, first_timeout=first
        )
        if session is None:
            if self._master_kind_option == "rmqha":
                raise _NotAnswering(
                    f"master {master} does not answer the rmqha extension "
                    "(--master-kind rmqha): not replicating classically"
                )
            if known == "rmqha":
                raise _NotAnswering(
                    f"master {master} spoke the rmqha extension before but is not "
                    "answering; not falling back to classic replication (if it is "
                    "now a RocketMQ master, restart with --master-kind rocketmq)"
                )
            self._learnt("rocketmq")
            self._classic(
                f"master {master} does not answer the rmqha control extension "
                "(a RocketMQ master?)"
            )
            return None
        client, info = session
        try:
            self._learnt("rmqha")
            self._set_framing(info.checked_framing, bool(info.features & FEATURE_IDENTIFY))
            ours = self.commitlog.segment_size
            if info.segment_size != ours:
                raise _Halt(
                    f"master {master} uses segments of {info.segment_size} bytes "
                    f"(mappedFileSizeCommitLog) and this slave's store {ours}: a "
                    "slave's segment size must be its master's (start the slave "
                    f"on an empty store with --segment-size {info.segment_size})"
                )
            return await find_divergence(self.commitlog, client, info, slave_end=slave_end)
        finally:
            client.close()

    async def _act_on(self, divergence: Divergence | None) -> None:
        if not self.running:
            return
        service = self.ha_service
        if divergence is None:
            if service is not None and not service.running:
                service.startService()
            return
        self.divergence = divergence
        self.divergences[divergence.kind] += 1
        mode = self._on_divergence
        if mode == "truncate" and divergence.truncate_to is None:
            mode = "halt"
        self._log.warn(
            "divergence: {what}; on-divergence={mode}",
            what=divergence.describe(),
            mode=mode,
        )
        if service is not None and service.running:
            await service.stopService()
        if mode == "halt":
            return
        if mode == "truncate":
            assert divergence.truncate_to is not None
            self.commitlog.truncate_replica(divergence.truncate_to)
        else:
            await self._rebootstrap()
        self.divergence = None
        if self.running and self.ha_service is not None:
            self.ha_service.startService()

    async def _rebootstrap(self) -> None:
        """
        Move the store aside (never deleted) and start an empty one.
        """
        old = self.commitlog.store_dir
        await self.store.stopService()
        aside = f"{old}.diverged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        os.rename(old, aside)
        self._log.warn("moved the diverged store aside to {aside}", aside=aside)
        self.store.startService()
        if self.ha_service is not None:
            self.ha_service.disownServiceParent()
        self._build_slave_replication(self.commitlog)
        if self.master_kind is not None:
            # The memory of what the master is went aside with the store.
            self._learnt(self.master_kind)

    def stopService(self) -> Deferred[None]:
        """
        Stop replication, then close the store cleanly.
        """
        self.running = False
        if self._check_retry is not None:
            self._check_retry.cancel()
            self._check_retry = None
        d: Deferred[Any] = succeed(None)
        # The admin interface, then replication, then the store.
        for service in (self.http_service, self.ha_service):
            if service is not None:
                d.addBoth(_stop_child, service)
        self.http_service = self.ha_service = None
        self.group.stop()
        if self.master_factory is not None:
            # Stopping the listener leaves accepted connections open.
            master_factory = self.master_factory
            d.addBoth(lambda _: master_factory.disconnect_all("the master is stopping"))
        # The scrub reads the store's files: it stops before the store.
        d.addBoth(lambda _: self.scrub.stopService())
        d.addBoth(lambda _: self.store.stopService())
        return d

    @property
    def commitlog(self) -> CommitLog:
        commitlog = self.store.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return commitlog

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
        factory = self.master_factory
        if not self.role.is_master or factory is None:
            self.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE] += 1
            raise NotMasterError("messages are put on the master, this is a slave")
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
        factory.notify_appended()
        end = append.next_offset
        # Disk and replicas are waited for at the same time; the disk's
        # verdict comes first, as in RocketMQ's asyncPutMessage.
        waits = [self._replica_wait(end)]
        if commitlog.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            flushed: Deferred[PutStatus] = self.store.when_flushed(end).addCallback(
                lambda _: PutStatus.PUT_OK
            )
            flushed.addTimeout(
                self.sync_flush_timeout,
                self.reactor,
                onTimeoutCancel=timed_out_as(PutStatus.FLUSH_DISK_TIMEOUT),
            )
            waits.insert(0, flushed)
        if len(waits) == 1:
            return waits[0].addCallback(self._result, append)
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

    def _replica_wait(self, end: int) -> Deferred[PutStatus]:
        if self.role is not Role.SYNC_MASTER or self.in_sync_replicas <= 1:
            return succeed(PutStatus.PUT_OK)
        assert self.master_factory is not None
        in_sync = 1 + sum(
            1
            for ack in self.master_factory.ack_offsets()
            if end - ack < self.slave_fallbehind_max
        )
        if in_sync < self.min_in_sync_replicas:
            return succeed(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        if in_sync < self.in_sync_replicas:
            return succeed(PutStatus.SLAVE_NOT_AVAILABLE)
        started = self.reactor.seconds()

        def observe(status: PutStatus) -> PutStatus:
            self.replication_wait.observe(self.reactor.seconds() - started)
            return status

        return self.group.wait_for(end).addCallback(observe)

    def _result(self, status: PutStatus, append: AppendResult) -> PutMessageResult:
        self.put_statuses[status] += 1
        return PutMessageResult(status, append)

    def _acks_changed(self) -> None:
        """
        A slave acknowledged or went away: the quorum offset is the k-th
        highest ack among the connected slaves (k = inSyncReplicas - 1).
        """
        needed = self.in_sync_replicas - 1
        if needed <= 0 or self.master_factory is None:
            return
        acks = sorted(self.master_factory.ack_offsets(), reverse=True)
        self.group.quorum_changed(acks[needed - 1] if len(acks) >= needed else -1)

    @property
    def master_endpoint(self) -> str | None:
        """
        On a slave, the master's endpoint description.
        """
        master = self._master_endpoint
        if master is None or isinstance(master, str):
            return master
        return str(getattr(master, "description", master))

    def slaves(self) -> list[SlaveStatus]:
        """
        On a master, the status of each connected slave.
        """
        return self.master_factory.slaves() if self.master_factory else []

    def http_address(self) -> Deferred[Any]:
        """
        Fires with the address the admin HTTP port listens on (for
        C{tcp:0}).
        """
        assert isinstance(self.http_service, StreamServerEndpointService)
        d = self.http_service._waitingForPort
        assert d is not None
        return d.addCallback(lambda port: port.getHost())

    def ha_address(self) -> Deferred[Any]:
        """
        On a master, fires with the address the HA port listens on (for
        C{tcp:0}).
        """
        assert isinstance(self.ha_service, StreamServerEndpointService)
        d = self.ha_service._waitingForPort
        assert d is not None
        return d.addCallback(lambda port: port.getHost())
