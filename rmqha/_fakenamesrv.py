# -*- test-case-name: tests.test_testing_namesrv -*-
"""
L{FakeNameServer}: an in-memory RocketMQ NameServer for tests and the demo
(exported by L{rmqha.testing}).  Not for production: users run RocketMQ's
own NameServer (C{mqnamesrv}); rmqha does not ship one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import connectionDone
from twisted.internet.interfaces import (
    IAddress,
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.task import Clock, LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
    make_response,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import DataVersion, JSONValue, TopicConfig, TopicTable, dump_fastjson
from rmqha.remoting.namesrv import (
    MASTER_ID,
    GetRouteInfoRequestHeader,
    RegisterBodyError,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
    body_crc32,
    decode_register_body,
)
from rmqha.remoting.protocol import (
    Answer,
    Dispatcher,
    IRemotingHandler,
    RemotingFactory,
    RemotingProtocol,
)

__all__ = [
    "BROKER_CHANNEL_EXPIRED_TIME",
    "FakeNameServer",
    "MemoryNameServerEndpoint",
    "RegistrationRecord",
    "SCAN_INTERVAL",
]

#: C{RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME}: a broker not heard
#: from for longer is forgotten (seconds).
BROKER_CHANNEL_EXPIRED_TIME = 120.0
#: C{NamesrvController} runs C{scanNotActiveBroker} every 10 s.
SCAN_INTERVAL = 10.0

#: Below it, C{GET_ROUTEINFO_BY_TOPIC} is answered with unquoted integer
#: keys (C{MQVersion.Version.V4_9_4.ordinal()}).
_STANDARD_JSON_VERSION = 401


@dataclasses.dataclass(frozen=True)
class RegistrationRecord:
    """
    One REGISTER_BROKER the fake took: its header and decoded body.
    """

    header: RegisterBrokerRequestHeader
    body: RegisterBrokerBody


@dataclasses.dataclass
class _Live:
    data_version: DataVersion
    ha_server_addr: str
    #: When it last registered (clock seconds).
    last_update: float = 0.0
    #: The connection it last registered over (C{None}: not over one).
    channel: RemotingProtocol | None = None


@dataclasses.dataclass
class _BrokerData:
    cluster: str
    broker_name: str
    addrs: dict[int, str]


@dataclasses.dataclass(frozen=True)
class _QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int


class FakeNameServer:
    """
    A RocketMQ NameServer in memory, keeping what C{RouteInfoManager} keeps
    and answering as 4.9.8's C{DefaultRequestProcessor} does:

        - REGISTER_BROKER: the broker's address under its cluster, name and
          id (an address registered under another id first removed: a
          slave promoted to id 0); topics taken only from brokerId 0, when
          its DataVersion changed or on its first registration; a slave
          answered its live master's C{haServerAddr} and C{masterAddr}; a
          bad C{bodyCrc32} answered SYSTEM_ERROR C{crc32 not match};
        - UNREGISTER_BROKER: the broker's id dropped (its name, and its
          topics' queue data, when none is left);
        - GET_ROUTEINFO_BY_TOPIC: the topic's queue data and its brokers'
          addresses, or TOPIC_NOT_EXIST (standard JSON for a requester of
          version 401 or more, or one asking for it; else unquoted integer
          keys, as 4.9.8);
        - GET_BROKER_CLUSTER_INFO: C{ClusterInfo} (unquoted integer keys).

    It forgets a broker (as C{RouteInfoManager.onChannelDestroy}: its
    address, its name when no address is left, and then its topics'
    queue data) when the connection it last registered over closes, and
    when it has not registered for more than
    L{BROKER_CHANNEL_EXPIRED_TIME} (C{scanNotActiveBroker}, every
    L{SCAN_INTERVAL} while any broker is live; that connection is closed
    too).

    What it does not do: KV config, filter servers in routes, and
    everything else a NameServer answers (REQUEST_CODE_NOT_SUPPORTED).

    @ivar registrations: every REGISTER_BROKER taken, oldest first.
    @ivar unregistrations: every UNREGISTER_BROKER taken.
    @ivar up: while false, L{client_endpoint}s refuse connections (a
        NameServer that is down).
    @ivar forgotten: the broker addresses it forgot, oldest first, each
        with why (C{"expired"}, C{"channel closed"}).
    """

    _log = Logger()

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.cluster_addr: dict[str, set[str]] = {}
        self.broker_addr: dict[str, _BrokerData] = {}
        self.topic_queues: dict[str, dict[str, _QueueData]] = {}
        self.live: dict[str, _Live] = {}
        self.registrations: list[RegistrationRecord] = []
        self.unregistrations: list[UnregisterBrokerRequestHeader] = []
        self.forgotten: list[tuple[str, str]] = []
        self.up = True
        self.handler = Dispatcher(
            {
                RequestCode.REGISTER_BROKER: self._register,
                RequestCode.UNREGISTER_BROKER: self._unregister,
                RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
                RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            }
        )
        self.factory: RemotingFactory = _NameServerFactory(self, clock)
        self._endpoints: list[MemoryNameServerEndpoint] = []
        #: C{scanNotActiveBroker}, while any broker is live.
        self._scan: LoopingCall | None = None

    # -- serving ------------------------------------------------------------

    def listen(self, reactor: Any, description: str = "tcp:0:interface=127.0.0.1") -> Deferred[IListeningPort]:
        """
        Listen on a real port (port 0 by default: read the one given from
        the result's C{getHost()}).
        """
        d: Deferred[IListeningPort] = serverFromString(reactor, description).listen(self.factory)
        return d

    def client_endpoint(self, clock: Clock) -> MemoryNameServerEndpoint:
        """
        A client endpoint whose connections reach this fake in memory, on
        C{clock} (see L{MemoryNameServerEndpoint}).
        """
        endpoint = MemoryNameServerEndpoint(self, clock)
        self._endpoints.append(endpoint)
        return endpoint

    def flush(self) -> None:
        """Move every in-memory connection's bytes until all are quiet."""
        for endpoint in self._endpoints:
            endpoint.flush()

    # -- what it holds ----------------------------------------------------------

    def brokers(self, broker_name: str) -> Mapping[int, str]:
        """The registered ids and addresses of C{broker_name}."""
        data = self.broker_addr.get(broker_name)
        return dict(data.addrs) if data is not None else {}

    def topic_names(self) -> set[str]:
        """The topics with queue data."""
        return set(self.topic_queues)

    # -- handlers ----------------------------------------------------------------

    def _register(
        self,
        request: RemotingCommand,
        peer: IAddress | None,
        channel: RemotingProtocol | None = None,
    ) -> RemotingCommand:
        try:
            header = header_from_ext_fields(RegisterBrokerRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        if header.body_crc32 != 0 and body_crc32(request.body) != header.body_crc32:
            return make_response(request, ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if request.body:
            try:
                body = decode_register_body(request.body, header.compressed)
            except RegisterBodyError as e:
                return make_response(request, ResponseCode.SYSTEM_ERROR, f"Failed to decode RegisterBrokerBody: {e}")
        else:
            body = RegisterBrokerBody(TopicTable(DataVersion(timestamp=0), {}))
        self.registrations.append(RegistrationRecord(header, body))
        ha, master = self.register_broker(header, body, channel)
        ext = header_to_ext_fields(RegisterBrokerResponseHeader(ha, master))
        return make_response(request, ResponseCode.SUCCESS, None, ext_fields=ext)

    def register_broker(
        self,
        header: RegisterBrokerRequestHeader,
        body: RegisterBrokerBody,
        channel: RemotingProtocol | None = None,
    ) -> tuple[str | None, str | None]:
        """
        C{RouteInfoManager.registerBroker}, over C{channel} (the connection
        whose end forgets the broker) if given.

        @return: the live master's C{(haServerAddr, masterAddr)} for a
            slave, else C{(None, None)}.
        """
        self.cluster_addr.setdefault(header.cluster_name, set()).add(header.broker_name)
        data = self.broker_addr.get(header.broker_name)
        first = data is None
        if data is None:
            data = _BrokerData(header.cluster_name, header.broker_name, {})
            self.broker_addr[header.broker_name] = data
        for broker_id, addr in list(data.addrs.items()):
            if addr == header.broker_addr and broker_id != header.broker_id:
                del data.addrs[broker_id]
        old = data.addrs.get(header.broker_id)
        data.addrs[header.broker_id] = header.broker_addr
        first = first or old is None
        version = body.topics.data_version
        if header.broker_id == MASTER_ID:
            prev = self.live.get(header.broker_addr)
            if first or prev is None or not prev.data_version.same(version):
                for topic in body.topics.topics.values():
                    self._queue_data(header.broker_name, topic)
        self.live[header.broker_addr] = _Live(
            version, header.ha_server_addr, self.clock.seconds(), channel
        )
        self._start_scan()
        if header.broker_id != MASTER_ID:
            master_addr = data.addrs.get(MASTER_ID)
            if master_addr is not None and master_addr in self.live:
                return self.live[master_addr].ha_server_addr, master_addr
        return None, None

    def _queue_data(self, broker_name: str, topic: TopicConfig) -> None:
        self.topic_queues.setdefault(topic.topic_name, {})[broker_name] = _QueueData(
            broker_name,
            topic.read_queue_nums,
            topic.write_queue_nums,
            topic.perm,
            topic.topic_sys_flag,
        )

    def _unregister(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        try:
            header = header_from_ext_fields(UnregisterBrokerRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        self.unregistrations.append(header)
        self.live.pop(header.broker_addr, None)
        self._stop_scan_if_idle()
        data = self.broker_addr.get(header.broker_name)
        if data is not None:
            data.addrs.pop(header.broker_id, None)
            if not data.addrs:
                del self.broker_addr[header.broker_name]
                names = self.cluster_addr.get(header.cluster_name)
                if names is not None:
                    names.discard(header.broker_name)
                    if not names:
                        del self.cluster_addr[header.cluster_name]
                for topic in list(self.topic_queues):
                    self.topic_queues[topic].pop(header.broker_name, None)
                    if not self.topic_queues[topic]:
                        del self.topic_queues[topic]
        return make_response(request, ResponseCode.SUCCESS)

    # -- forgetting brokers ----------------------------------------------------

    def _start_scan(self) -> None:
        if self._scan is None:
            scan = LoopingCall(self.expire_idle)
            scan.clock = self.clock
            self._scan = scan
            scan.start(SCAN_INTERVAL, now=False)

    def _stop_scan_if_idle(self) -> None:
        if not self.live and self._scan is not None:
            if self._scan.running:
                self._scan.stop()
            self._scan = None

    def expire_idle(self) -> int:
        """
        C{scanNotActiveBroker}: forget every broker that has not registered
        for more than L{BROKER_CHANNEL_EXPIRED_TIME}, and close the
        connection it registered over.  Runs every L{SCAN_INTERVAL} while
        any broker is live.

        @return: how many were forgotten.
        """
        now = self.clock.seconds()
        expired = [
            (addr, live)
            for addr, live in self.live.items()
            if live.last_update + BROKER_CHANNEL_EXPIRED_TIME < now
        ]
        for addr, live in expired:
            self._log.warn(
                "the broker channel expired, {addr} {ms}ms",
                addr=addr,
                ms=int(BROKER_CHANNEL_EXPIRED_TIME * 1000),
            )
            self._forget(addr, "expired")
            if live.channel is not None and live.channel.transport is not None:
                live.channel.transport.loseConnection()
        self._stop_scan_if_idle()
        return len(expired)

    def channel_destroyed(self, channel: RemotingProtocol) -> None:
        """
        C{onChannelDestroy}: a connection ended; forget the brokers whose
        last registration came over it.
        """
        for addr in [a for a, live in self.live.items() if live.channel is channel]:
            self._forget(addr, "channel closed")
        self._stop_scan_if_idle()

    def _forget(self, addr: str, why: str) -> None:
        # As onChannelDestroy: the address out of the live table and of its
        # broker name; the name out of its cluster, and its queue data out
        # of every topic, when no address of it is left.
        self.live.pop(addr, None)
        self.forgotten.append((addr, why))
        for name, data in list(self.broker_addr.items()):
            ids = [i for i, a in data.addrs.items() if a == addr]
            if not ids:
                continue
            del data.addrs[ids[0]]
            if not data.addrs:
                del self.broker_addr[name]
                for cluster, names in list(self.cluster_addr.items()):
                    if name in names:
                        names.discard(name)
                        if not names:
                            del self.cluster_addr[cluster]
                        break
                for topic in list(self.topic_queues):
                    self.topic_queues[topic].pop(name, None)
                    if not self.topic_queues[topic]:
                        del self.topic_queues[topic]
            break

    @staticmethod
    def _broker_json(data: _BrokerData, standard: bool) -> dict[str | int, JSONValue]:
        addrs: dict[str | int, JSONValue] = {
            (str(k) if standard else k): data.addrs[k] for k in sorted(data.addrs)
        }
        return {"brokerAddrs": addrs, "brokerName": data.broker_name, "cluster": data.cluster}

    def _route(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        try:
            header = header_from_ext_fields(GetRouteInfoRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        queues = self.topic_queues.get(header.topic, {})
        brokers = [self.broker_addr[n] for n in sorted(queues) if n in self.broker_addr]
        if not queues or not brokers:
            return make_response(
                request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {header.topic}",
            )
        standard = request.version >= _STANDARD_JSON_VERSION or bool(header.accept_standard_json_only)
        route: dict[str | int, JSONValue] = {
            "brokerDatas": [self._broker_json(b, standard) for b in brokers],
            "filterServerTable": {},
            "queueDatas": [
                {
                    "brokerName": q.broker_name,
                    "perm": q.perm,
                    "readQueueNums": q.read_queue_nums,
                    "topicSysFlag": q.topic_sys_flag,
                    "writeQueueNums": q.write_queue_nums,
                }
                for q in (queues[n] for n in sorted(queues))
            ],
        }
        text = json.dumps(route, sort_keys=True, separators=(",", ":")) if standard else dump_fastjson(route)
        return make_response(request, ResponseCode.SUCCESS, body=text.encode("utf-8"))

    def _cluster_info(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        info: dict[str | int, JSONValue] = {
            "brokerAddrTable": {
                name: self._broker_json(self.broker_addr[name], False) for name in sorted(self.broker_addr)
            },
            "clusterAddrTable": {
                cluster: sorted(names) for cluster, names in sorted(self.cluster_addr.items())
            },
        }
        return make_response(request, ResponseCode.SUCCESS, body=dump_fastjson(info).encode("utf-8"))


@implementer(IRemotingHandler)
class _ChannelHandler:
    """
    The fake's handler for one connection: a REGISTER_BROKER is taken
    with the connection it came over (its end forgets the broker).
    """

    def __init__(self, server: FakeNameServer, channel: RemotingProtocol) -> None:
        self.server = server
        self.channel = channel

    def handles(self, code: int) -> bool:
        return self.server.handler.handles(code)

    def handle(self, command: RemotingCommand, peer: IAddress | None) -> Answer:
        if command.code == RequestCode.REGISTER_BROKER:
            return self.server._register(command, peer, self.channel)
        return self.server.handler.handle(command, peer)


class _NameServerProtocol(RemotingProtocol):
    """A connection to the fake: its end is C{onChannelDestroy}."""

    def __init__(self, server: FakeNameServer, clock: IReactorTime, **options: Any) -> None:
        super().__init__(_ChannelHandler(server, self), clock, **options)
        self.server = server

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.server.channel_destroyed(self)


class _NameServerFactory(RemotingFactory):
    def __init__(self, server: FakeNameServer, clock: IReactorTime) -> None:
        super().__init__(server.handler, clock)
        self.server = server

    def buildProtocol(self, addr: IAddress | None) -> RemotingProtocol:
        protocol = _NameServerProtocol(self.server, self.clock, **self.options)
        protocol.factory = self
        return protocol


@implementer(IStreamClientEndpoint)
class MemoryNameServerEndpoint:
    """
    A client endpoint reaching a L{FakeNameServer} in memory (each
    connection a L{rmqha.testing.MemoryConnection}, in C{connections});
    it refuses connections while the fake is not C{up}.  Bytes move on
    L{flush} (or the fake's).
    """

    def __init__(self, server: FakeNameServer, clock: Clock) -> None:
        self.server = server
        self.clock = clock
        self.connections: list[Any] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        from rmqha.testing import connect_in_memory

        if not self.server.up:
            return fail(ConnectionRefusedError("the fake NameServer is down"))
        port = 50000 + len(self.connections)
        connection = connect_in_memory(
            self.server.factory,
            factory,
            self.clock,
            master_address=IPv4Address("TCP", "127.0.0.1", 9876),
            slave_address=IPv4Address("TCP", "127.0.0.1", port),
        )
        self.connections.append(connection)
        return succeed(connection.client)

    def flush(self) -> None:
        for connection in self.connections:
            connection.flush()

    def hang_up(self) -> None:
        """Close every connection (a NameServer going down)."""
        for connection in self.connections:
            connection.hang_up()
