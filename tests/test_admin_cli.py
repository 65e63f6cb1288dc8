"""
Tests for C{rmqha admin}: L{rmqha.cli.admin_query} through a
L{RemotingClient} joined in memory to an rmqha broker's remoting port.
"""

from __future__ import annotations

import io
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import ensureDeferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test.iosim import FakeTransport, connect

from rmqha import cli
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.protocol import RemotingClient
from tests.test_remoting_broker import _CREATE, _BrokerCase


class AdminTests(_BrokerCase):
    def query(self, action: str) -> Any:
        client_reactor = MemoryReactorClock()
        client = RemotingClient(client_reactor, "tcp:host=127.0.0.1:port=10911")
        client.startService()
        self.addCleanup(client.stopService)
        d = ensureDeferred(cli.admin_query(client, "127.0.0.1:10911", action, 3.0))
        (dialled,) = client_reactor.tcpClients
        protocol = dialled[2].buildProtocol(IPv4Address("TCP", "127.0.0.1", 10911))
        server = self.remoting_factory().buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        pump = connect(
            server, FakeTransport(server, isServer=True),
            protocol, FakeTransport(protocol, isServer=False),
        )
        for _ in range(10):
            pump.flush()
            client_reactor.advance(0.01)
            self.reactor.advance(0.01)
        return self.successResultOf(d)

    def test_topics(self) -> None:
        self.start()
        created = self.connect().ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {**_CREATE, "perm": "4"})
        self.assertEqual(created.code, ResponseCode.SUCCESS)
        data = self.query("topics")
        self.assertEqual(data["Orders"], {"readQueueNums": 4, "writeQueueNums": 4, "perm": 4})
        self.assertIn("TBW102", data)
        text = cli.render_admin("topics", data)
        (line,) = [l for l in text.splitlines() if l.startswith("Orders ")]
        self.assertEqual(line.split(), ["Orders", "4", "4", "4"])

    def test_broker_status(self) -> None:
        self.start()
        data = self.query("broker-status")
        self.assertEqual(list(data), sorted(data))
        self.assertEqual(data["brokerVersionDesc"], "V4_9_8")
        self.assertIn(f"{'brokerVersionDesc':<32}: V4_9_8\n", cli.render_admin("broker-status", data))

    def test_consumer_offsets(self) -> None:
        broker = self.start()
        broker.metadata.commit_offset("g1", "Orders", 2, 17)
        data = self.query("consumer-offsets")
        self.assertEqual(data["Orders@g1"], {"2": 17})
        self.assertIn("Orders@g1 2 17\n", cli.render_admin("consumer-offsets", data))

    def test_refused(self) -> None:
        """
        A refused connection is one line naming the address.
        """
        client_reactor = MemoryReactorClock()
        client = RemotingClient(client_reactor, "tcp:host=127.0.0.1:port=10911")
        client.startService()
        self.addCleanup(client.stopService)
        d = ensureDeferred(cli.admin_query(client, "127.0.0.1:10911", "topics", 3.0))
        connector = client_reactor.connectors[0]
        client_reactor.tcpClients[0][2].clientConnectionFailed(connector, Failure(ConnectionRefusedError()))
        failure = self.failureResultOf(d, cli._CommandError)
        message = str(failure.value)
        self.assertIn("broker 127.0.0.1:10911: cannot connect", message)
        self.assertNotIn("\n", message)

    def test_bad_broker_argument(self) -> None:
        err = io.StringIO()
        self.assertEqual(cli.main(["admin", "topics", "--broker", "nowhere"], io.StringIO(), err), 2)
        self.assertIn("is not HOST:PORT", err.getvalue())
