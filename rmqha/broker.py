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

import enum
from typing import Any, Callable

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import clientFromString, serverFromString
from twisted.logger import Logger

from rmqha.commitlog import AppendResult, CommitLog, FlushDiskType, Message
from rmqha.master import DEFAULT_HA_CONFIG, HAConfig, MasterFactory, SlaveStatus
from rmqha.slave import SlaveFactory, make_slave_service
from rmqha.storeservice import DEFAULT_FLUSH_INTERVAL, CommitLogService

__all__ = ["Role", "Broker", "NotMasterError", "DEFAULT_MAX_UNFLUSHED"]

#: A slave stops reading while this much received data is not on disk.
DEFAULT_MAX_UNFLUSHED = 256 * 1024 * 1024


def _stop_child(_: object, service: IService) -> Deferred[None]:
    stopping = service.stopService()
    d: Deferred[Any] = stopping if isinstance(stopping, Deferred) else succeed(None)
    return d.addBoth(lambda _: service.disownServiceParent())


class Role(enum.Enum):
    """
    What a broker does in its HA pair.
    """

    MASTER = "master"
    SLAVE = "slave"


class NotMasterError(Exception):
    """
    Messages are put on the master only.
    """


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
        ha_listen: str = "tcp:10912",
        master_endpoint: str | None = None,
        http: str | None = None,
        config: HAConfig = DEFAULT_HA_CONFIG,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        retry_policy: Callable[[int], float] | None = None,
        max_unflushed: int = DEFAULT_MAX_UNFLUSHED,
    ) -> None:
        """
        @param ha_listen: a Twisted server endpoint description for the HA
            port (master).
        @param master_endpoint: a Twisted client endpoint description of the
            master's HA port (slave).
        @param http: a Twisted server endpoint description for the admin
            HTTP interface (L{rmqha.admin}), or C{None} for none.
        @param max_unflushed: a slave stops reading from its master while
            more received bytes than this are not on disk.
        """
        super().__init__()
        if role is Role.SLAVE and not master_endpoint:
            raise ValueError("a slave needs the master's address")
        self.reactor = reactor
        self.role = role
        self.config = config
        self._ha_listen = ha_listen
        self._master_endpoint = master_endpoint
        self._retry_policy = retry_policy
        self._http = http
        self._max_unflushed = max_unflushed
        self.http_service: StreamServerEndpointService | None = None
        self.store = CommitLogService(
            open_commitlog, reactor, flush_interval=flush_interval
        )
        self.store.setName("store")
        self.store.setServiceParent(self)
        #: Messages and bytes put on this master.
        self.puts = 0
        self.put_bytes = 0
        self.master_factory: MasterFactory | None = None
        self.slave_factory: SlaveFactory | None = None
        self.ha_service: IService | None = None

    def startService(self) -> None:
        # The store first: the HA half needs the open log.
        self.store.startService()
        commitlog = self.store.commitlog
        assert commitlog is not None
        if self.role is Role.MASTER:
            self.master_factory = MasterFactory(commitlog, self.reactor, self.config)
            self.ha_service = StreamServerEndpointService(
                serverFromString(self.reactor, self._ha_listen), self.master_factory
            )
        else:
            assert self._master_endpoint is not None
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
            )
            self.store.flush_observers.append(self.slave_factory.flushed)
            self.ha_service = make_slave_service(
                clientFromString(self.reactor, self._master_endpoint),
                self.slave_factory,
                self.reactor,
                self._retry_policy,
            )
        self.ha_service.setName("ha")
        self.ha_service.setServiceParent(self)
        # MultiService starts every child; the store is already running.
        self.running = True
        self.ha_service.startService()
        if self._http is not None:
            from twisted.web.server import Site

            from rmqha.admin import AdminRoot

            self.http_service = StreamServerEndpointService(
                serverFromString(self.reactor, self._http), Site(AdminRoot(self))
            )
            self.http_service.setName("http")
            self.http_service.setServiceParent(self)
            self.http_service.startService()

    def stopService(self) -> Deferred[None]:
        """
        Stop replication, then close the store cleanly.
        """
        self.running = False
        d: Deferred[Any] = succeed(None)
        # The admin interface, then replication, then the store.
        for service in (self.http_service, self.ha_service):
            if service is not None:
                d.addBoth(_stop_child, service)
        self.http_service = self.ha_service = None
        if self.master_factory is not None:
            # Stopping the listener leaves accepted connections open.
            master_factory = self.master_factory
            d.addBoth(lambda _: master_factory.disconnect_all("the master is stopping"))
        d.addBoth(lambda _: self.store.stopService())
        return d

    @property
    def commitlog(self) -> CommitLog:
        commitlog = self.store.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return commitlog

    def put(self, message: Message) -> Deferred[AppendResult]:
        """
        Store C{message} on this master and start replicating it.

        @return: fires with where it was stored.
        @raise NotMasterError: this broker is a slave.
        """
        if self.role is not Role.MASTER or self.master_factory is None:
            raise NotMasterError("messages are put on the master, this is a slave")
        result = self.commitlog.put(message)
        self.puts += 1
        self.put_bytes += result.size
        self.master_factory.notify_appended()
        return succeed(result)

    @property
    def master_endpoint(self) -> str | None:
        """
        On a slave, the master's endpoint description.
        """
        return self._master_endpoint

    def slaves(self) -> list[SlaveStatus]:
        """
        On a master, the status of each connected slave.
        """
        return self.master_factory.slaves() if self.master_factory else []

    def ha_address(self) -> Deferred[Any]:
        """
        On a master, fires with the address the HA port listens on (for
        C{tcp:0}).
        """
        assert isinstance(self.ha_service, StreamServerEndpointService)
        d = self.ha_service._waitingForPort
        assert d is not None
        return d.addCallback(lambda port: port.getHost())
