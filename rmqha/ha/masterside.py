# -*- test-case-name: tests.test_roles,tests.test_limits,tests.test_group -*-
"""
A master's side of replication, as one service: the HA port (behind the
connection limiter), the L{MasterFactory} serving slaves from the open
commit log, and the L{HAService} their acks feed.

The port is listened on first (L{MasterSide.listen}, from the broker's
C{privilegedStartService}, before the store is opened); the factory is
built when the store is open (L{MasterSide.open}).  Stopping closes the
port, disconnects every slave, and ends the puts still waiting for
replicas with C{SLAVE_NOT_AVAILABLE}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger

from rmqha._busypoll import busy_poll
from rmqha._ports import OpenedLater, listen
from rmqha.store.commitlog import CommitLog
from rmqha.ha.auth import GroupAuth
from rmqha.ha.config import HAConfig
from rmqha.ha.epochs import EpochFile
from rmqha.ha.fence import OPEN
from rmqha.ha.group import Finish, HAService, Histogram, PutMessageResult, PutStatus
from rmqha.ha.interfaces import IAppendedTo, IFence
from rmqha.ha.master import MasterFactory, SlaveStatus
from rmqha.ha.replicas import EarlyFrames, Replicas
from rmqha.tls import PeerPolicy, exposure_warning

__all__ = ["MasterSide", "MasterSideStatus"]


@dataclass(frozen=True)
class MasterSideStatus:
    """
    A master's side of replication as it stands, read-only
    (L{MasterSide.status}; the admin interface shows it).

    @ivar slaves: each connected slave (in no particular order).
    @ivar checksum_failures: checked-framing reports that failed their
        CRC, all slaves together.
    @ivar in_sync_replicas: the copies a put would count now, the
        master's included (L{HAService.in_sync_replicas}).
    @ivar min_in_sync_replicas: the copies every C{PUT_OK} needs
        (L{HAService.min_in_sync_replicas}).
    """

    slaves: tuple[SlaveStatus, ...] = ()
    checksum_failures: int = 0
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1


class MasterSide(Service):
    """
    @ivar factory: the L{MasterFactory}, once the store is open.
    @ivar ha: the L{HAService} (quorum and waiting puts).
    @ivar port: the HA port's service, once listening.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        where: str | IStreamServerEndpoint,
        appended: IAppendedTo,
        *,
        sync: bool,
        config: HAConfig,
        peer_policy: PeerPolicy,
        in_sync_replicas: int,
        min_in_sync_replicas: int,
        slave_fallbehind_max: int,
        slave_timeout: float,
        replication_wait: Histogram,
        limited: Callable[[str, Any], Any],
        held: tuple[StreamServerEndpointService, OpenedLater] | None = None,
        auth: GroupAuth | None = None,
        fence: IFence = OPEN,
        finish: Finish = PutMessageResult,
    ) -> None:
        """
        @param appended: the store the master's log is opened by (how far
            it has appended, for the parts built before it is open).
        @param limited: wraps the port's factory in the connection limiter.
        @param held: a port its owner listens on for its whole life, and
            the factory it listens with (failover: L{rmqha.ha.haport.HAGate}):
            this side serves slaves through it while it runs, and neither
            opens nor closes the port.
        @param auth: failover: how slaves prove their node ids
            (L{MasterFactory}).
        @param fence: failover: whether this master may take and
            acknowledge puts, and whose acks count (L{rmqha.ha.fence}).
        @param finish: what a put's wait fires with (L{HAService}).
        """
        self.reactor = reactor
        self._where = where
        self._config = config
        self._peer_policy = peer_policy
        self._limited = limited
        self._auth = auth
        #: Whether puts may be taken and acknowledged (failover).
        self.fence = fence
        #: The slaves' connections and acks.
        self.replicas = Replicas(reactor, appended, fence=fence, auth=auth)
        #: When appends are sent to the slaves.
        self.early = EarlyFrames(reactor, self.replicas, appended)
        self.ha = HAService(
            reactor,
            acks=self.replicas,
            appended=appended,
            fence=fence,
            listener=self.early,
            finish=finish,
            sync=sync,
            in_sync_replicas=in_sync_replicas,
            min_in_sync_replicas=min_in_sync_replicas,
            slave_fallbehind_max=slave_fallbehind_max,
            slave_timeout=slave_timeout,
            replication_wait=replication_wait,
        )
        self.factory: MasterFactory | None = None
        self.port: StreamServerEndpointService | None = None
        self._opened_later = OpenedLater()
        self._held = held is not None
        if held is not None:
            self.port, self._opened_later = held
        self._unobserve: Callable[[], None] = lambda: None
        self._unobserve_damage: Callable[[], None] = lambda: None
        self._busy = busy_poll(reactor, self.ha, 0)

    def listen(self) -> None:
        """
        Listen on the HA port (once).

        @raise rmqha._ports.ListenFailed: naming the port and why.
        """
        if self.port is not None:
            return
        if isinstance(self._where, str):
            warning = exposure_warning(self._where)
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
        self.port = listen(
            self.reactor, "ha", self._where, self._limited("HA", self._opened_later)
        )

    def open(self, commitlog: CommitLog, epochs: EpochFile | None = None) -> None:
        """
        The store is open: serve slaves from C{commitlog} (and answer
        EPOCHS from C{epochs}, failover).
        """
        factory = self.factory = MasterFactory(
            commitlog,
            self.reactor,
            self._config,
            self._peer_policy,
            ha=self.ha,
            auth=self._auth,
            replicas=self.replicas,
            early=self.early,
            epochs=epochs,
        )
        self._opened_later.factory = factory
        # Every append wakes the slaves' connections, whoever wrote it: the
        # log tells its observers, no writer has to remember to.  (The
        # early-frames policy observes it itself: what
        # MasterFactory.notify_appended would pass on, one call less a put.)
        self._unobserve = commitlog.observe_appends(factory.early.appended)
        # A segment file changed under the log: replication halts, each
        # slave told why (docs/store.md, "A segment file changed under the
        # open log").
        self._unobserve_damage = commitlog.observe_damage(factory.store_damaged)

    def startService(self) -> None:
        Service.startService(self)
        self.listen()
        # While a SYNC put waits, the reactor polls for the ack a moment
        # before it sleeps (docs/sync.md, "Busy polling").
        self._busy = busy_poll(self.reactor, self.ha, self._config.busy_poll)
        assert self.port is not None
        if not self._held:
            self.port.startService()

    def stopService(self) -> Deferred[None]:
        """
        Close the port, then drop every slave (closing a port leaves
        accepted connections open) and end the waiting puts.
        """
        Service.stopService(self)
        self._busy.stop()
        self._unobserve()
        self._unobserve_damage()
        self.ha.stop()
        self._opened_later.factory = None
        port, self.port = self.port, None
        d: Deferred[Any] = succeed(None)
        if port is not None and not self._held:
            stopping = port.stopService()
            if isinstance(stopping, Deferred):
                d = stopping
        factory = self.factory
        if factory is not None:
            d.addBoth(lambda _: factory.disconnect_all("the master is stopping"))
            d.addBoth(lambda _: factory.stopFactory())
        return d.addBoth(lambda _: None)

    def status(self) -> MasterSideStatus:
        """
        The slaves connected now, and the damaged reports counted (nothing
        before the store is open).
        """
        factory = self.factory
        if factory is None:
            return MasterSideStatus()
        return MasterSideStatus(
            tuple(factory.slaves()),
            factory.checksum_failures,
            self.ha.in_sync_replicas(),
            self.ha.min_in_sync_replicas,
        )
