"""
rmqha.testing.FakeNameServer: what it keeps and answers, as 4.9.8's
RouteInfoManager and DefaultRequestProcessor.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting._frames import RemotingCommand, header_to_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import DataVersion, TopicConfig, TopicTable
from rmqha.remoting.namesrv import (
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    UnregisterBrokerRequestHeader,
    body_crc32,
    encode_register_body,
)
from rmqha.remoting.protocol import RemotingClient
from rmqha.testing import FakeNameServer


def _table(counter: int, *names: str) -> TopicTable:
    return TopicTable(DataVersion(1000, counter), {n: TopicConfig(n, 4, 4) for n in names})


class FakeNameServerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.ns = FakeNameServer(self.clock)
        self.client = RemotingClient(None, self.ns.client_endpoint(self.clock), clock=self.clock)
        self.client.startService()
        self.addCleanup(self.client.stopService)

    def ask(self, command: RemotingCommand) -> RemotingCommand:
        out: list[Any] = []
        self.client.request(command, 3).addBoth(out.append)
        self.ns.flush()
        self.clock.advance(0)
        self.assertIsInstance(out[0], RemotingCommand)
        result: RemotingCommand = out[0]
        return result

    def register(self, broker_id: int, addr: str, table: TopicTable, crc: int | None = None, name: str = "b") -> RemotingCommand:
        body = encode_register_body(RegisterBrokerBody(table))
        header = RegisterBrokerRequestHeader(
            name, addr, "C", addr.replace(":10911", ":10912"), broker_id,
            body_crc32=body_crc32(body) if crc is None else crc,
        )
        return self.ask(
            RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=header_to_ext_fields(header), body=body)
        )

    def route(self, topic: str, version: int = 409) -> RemotingCommand:
        return self.ask(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, version=version, ext_fields={"topic": topic})
        )

    def test_slave_gets_its_masters_addresses(self) -> None:
        """
        A master is answered no addresses; a slave its live master's
        haServerAddr and masterAddr; before any master, none.
        """
        slave = self.register(1, "10.0.0.2:10911", _table(1))
        self.assertEqual(slave.code, ResponseCode.SUCCESS)
        self.assertNotIn("haServerAddr", slave.ext_fields or {})
        master = self.register(0, "10.0.0.1:10911", _table(1, "T"))
        self.assertEqual(master.ext_fields or {}, {})
        slave = self.register(1, "10.0.0.2:10911", _table(1))
        self.assertEqual(
            slave.ext_fields, {"haServerAddr": "10.0.0.1:10912", "masterAddr": "10.0.0.1:10911"}
        )
        self.assertEqual(len(self.ns.registrations), 3)

    def test_promotion_moves_address(self) -> None:
        """
        An address registered under another id first leaves its old id
        (a slave promoted to 0).
        """
        self.register(0, "10.0.0.1:10911", _table(1))
        self.register(1, "10.0.0.2:10911", _table(1))
        self.register(0, "10.0.0.2:10911", _table(1))
        self.assertEqual(self.ns.brokers("b"), {0: "10.0.0.2:10911"})

    def test_routes(self) -> None:
        """
        Topics come from brokerId 0 only, and again when its DataVersion
        changes; routes are standard JSON from version 401, unquoted
        integer keys before; an unknown topic is TOPIC_NOT_EXIST.
        """
        self.register(1, "10.0.0.2:10911", _table(1, "FromSlave"))
        self.register(0, "10.0.0.1:10911", _table(1, "T"))
        self.assertEqual(self.ns.topic_names(), {"T"})
        self.register(0, "10.0.0.1:10911", _table(1, "T", "Same"))
        self.assertEqual(self.ns.topic_names(), {"T"})
        self.register(0, "10.0.0.1:10911", _table(2, "T", "New"))
        self.assertEqual(self.ns.topic_names(), {"T", "New"})
        self.assertEqual(self.route("FromSlave").code, ResponseCode.TOPIC_NOT_EXIST)
        self.assertEqual(
            self.route("T").body,
            b'{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},'
            b'"brokerName":"b","cluster":"C"}],"filterServerTable":{},"queueDatas":[{"brokerName":"b",'
            b'"perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}',
        )
        self.assertIn(b'{0:"10.0.0.1:10911",1:"10.0.0.2:10911"}', self.route("T", version=317).body)

    def test_crc_mismatch(self) -> None:
        response = self.register(0, "10.0.0.1:10911", _table(1), crc=12345)
        self.assertEqual((response.code, response.remark), (ResponseCode.SYSTEM_ERROR, "crc32 not match"))
        self.assertEqual(self.ns.registrations, [])

    def test_unregister_and_cluster_info(self) -> None:
        self.register(0, "10.0.0.1:10911", _table(1, "T"))
        self.register(1, "10.0.0.2:10911", _table(1))
        info = self.ask(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
        self.assertEqual(
            info.body,
            b'{"brokerAddrTable":{"b":{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
            b'"brokerName":"b","cluster":"C"}},"clusterAddrTable":{"C":["b"]}}',
        )
        for broker_id, addr in ((1, "10.0.0.2:10911"), (0, "10.0.0.1:10911")):
            header = UnregisterBrokerRequestHeader("b", addr, "C", broker_id)
            response = self.ask(
                RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields=header_to_ext_fields(header))
            )
            self.assertEqual(response.code, ResponseCode.SUCCESS)
        self.assertEqual(self.ns.brokers("b"), {})
        self.assertEqual(self.ns.topic_names(), set())
        self.assertEqual(self.route("T").code, ResponseCode.TOPIC_NOT_EXIST)
        self.assertEqual(len(self.ns.unregistrations), 2)

    def test_bad_header(self) -> None:
        response = self.ask(RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={"brokerName": "b"}))
        self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("brokerAddr", response.remark or "")

    def test_other_codes_not_supported(self) -> None:
        response = self.ask(RemotingCommand(RequestCode.GET_KV_CONFIG))
        self.assertEqual(response.code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)

    def test_down_refuses(self) -> None:
        self.ns.up = False
        out: list[Any] = []
        client = RemotingClient(
            None, self.ns.client_endpoint(self.clock), clock=self.clock, retry_policy=lambda n: 1.0
        )
        client.startService()
        self.addCleanup(client.stopService)
        client.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), 3).addErrback(out.append)
        self.clock.advance(2)
        self.assertIn("refused", str(out[0].value).lower())


class ForgettingTests(SynchronousTestCase):
    """
    The fake forgets a broker as RocketMQ's RouteInfoManager does: not
    heard from for more than 120 s (scanned every 10 s), or when the
    connection it registered over closes (onChannelDestroy).
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.ns = FakeNameServer(self.clock)

    def client(self) -> RemotingClient:
        client = RemotingClient(None, self.ns.client_endpoint(self.clock), clock=self.clock)
        client.startService()
        self.addCleanup(client.stopService)
        return client

    def register(self, client: RemotingClient, broker_id: int, addr: str, table: TopicTable) -> None:
        body = encode_register_body(RegisterBrokerBody(table))
        header = RegisterBrokerRequestHeader(
            "b", addr, "C", addr.replace(":10911", ":10912"), broker_id, body_crc32=body_crc32(body)
        )
        out: list[Any] = []
        client.request(
            RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=header_to_ext_fields(header), body=body), 3
        ).addBoth(out.append)
        self.settle()
        self.assertEqual(out[0].code, ResponseCode.SUCCESS)

    def settle(self) -> None:
        for _ in range(3):
            self.ns.flush()
            self.clock.advance(0)

    def stop(self, client: RemotingClient) -> None:
        d = client.stopService()
        self.settle()
        self.successResultOf(d)

    def test_expired_after_120s(self) -> None:
        master, slave = self.client(), self.client()
        self.register(master, 0, "10.0.0.1:10911", _table(1, "T"))
        self.clock.advance(60)
        self.register(slave, 1, "10.0.0.2:10911", _table(1))
        self.clock.advance(60)
        self.settle()
        # 120 s is not more than 120 s.
        self.assertEqual(self.ns.brokers("b"), {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"})
        self.clock.advance(10)
        self.settle()
        self.assertEqual(self.ns.brokers("b"), {1: "10.0.0.2:10911"})
        self.assertEqual(self.ns.forgotten, [("10.0.0.1:10911", "expired")])
        # Its connection is closed; the name keeps its topics while an
        # address of it is left, as 4.9.8.
        self.assertFalse(master.connected)
        self.assertTrue(slave.connected)
        self.assertEqual(self.ns.topic_names(), {"T"})
        # A registration refreshes: the slave again at 170 s lives to 290 s+.
        self.clock.advance(40)
        self.register(slave, 1, "10.0.0.2:10911", _table(1))
        self.clock.advance(120)
        self.settle()
        self.assertEqual(self.ns.brokers("b"), {1: "10.0.0.2:10911"})
        self.clock.advance(10)
        self.settle()
        self.assertEqual(self.ns.brokers("b"), {})
        self.assertEqual((self.ns.topic_names(), self.ns.cluster_addr), (set(), {}))
        # Nothing live: the scan stops.
        self.assertIsNone(self.ns._scan)

    def test_connection_closed(self) -> None:
        master, slave = self.client(), self.client()
        self.register(master, 0, "10.0.0.1:10911", _table(1, "T"))
        self.register(slave, 1, "10.0.0.2:10911", _table(1))
        # The slave's broker comes back over a new connection, then the
        # old one ends: it stays.
        again = self.client()
        self.register(again, 1, "10.0.0.2:10911", _table(1))
        self.stop(slave)
        self.assertEqual(self.ns.brokers("b"), {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"})
        self.stop(master)
        self.assertEqual(self.ns.brokers("b"), {1: "10.0.0.2:10911"})
        self.assertEqual(self.ns.forgotten, [("10.0.0.1:10911", "channel closed")])
        self.stop(again)
        self.assertEqual(self.ns.brokers("b"), {})
        self.assertEqual((self.ns.topic_names(), self.ns.cluster_addr), (set(), {}))
        self.assertIsNone(self.ns._scan)
