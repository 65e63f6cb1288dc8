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
from twisted.internet.interfaces import (
    IAddress,
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.task import Clock
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
from rmqha.remoting.protocol import Dispatcher, RemotingFactory

__all__ = ["FakeNameServer", "RegistrationRecord", "MemoryNameServerEndpoint"]

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

    What it does not do: expire idle brokers (120 s) or drop a broker when
    its connection closes, KV config, filter servers in routes, and
    everything else a NameServer answers (REQUEST_CODE_NOT_SUPPORTED).

    @ivar registrations: every REGISTER_BROKER taken, oldest first.
    @ivar unregistrations: every UNREGISTER_BROKER taken.
    @ivar up: while false, L{client_endpoint}s refuse connections (a
        NameServer that is down).
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.cluster_addr: dict[str, set[str]] = {}
        self.broker_addr: dict[str, _BrokerData] = {}
        self.topic_queues: dict[str, dict[str, _QueueData]] = {}
        self.live: dict[str, _Live] = {}
        self.registrations: list[RegistrationRecord] = []
        self.unregistrations: list[UnregisterBrokerRequestHeader] = []
        self.up = True
        self.handler = Dispatcher(
            {
                RequestCode.REGISTER_BROKER: self._register,
                RequestCode.UNREGISTER_BROKER: self._unregister,
                RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
                RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            }
        )
        self.factory = RemotingFactory(self.handler, clock)
        self._endpoints: list[MemoryNameServerEndpoint] = []

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

    def _register(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
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
        ha, master = self.register_broker(header, body)
        ext = header_to_ext_fields(RegisterBrokerResponseHeader(ha, master))
        return make_response(request, ResponseCode.SUCCESS, None, ext_fields=ext)

    def register_broker(
        self, header: RegisterBrokerRequestHeader, body: RegisterBrokerBody
    ) -> tuple[str | None, str | None]:
        """
        C{RouteInfoManager.registerBroker}.

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
        self.live[header.broker_addr] = _Live(version, header.ha_server_addr)
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
