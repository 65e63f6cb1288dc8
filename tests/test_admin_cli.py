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
from rmqha.remoting._frames import RemotingCommand, make_response
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.protocol import Dispatcher, RemotingClient, RemotingFactory
from tests.test_remoting_broker import _CREATE, _BrokerCase


class AdminTests(_BrokerCase):
    def query(self, action: str, factory: Any = None) -> Any:
        """
        What L{cli.admin_run} (a client started and stopped around
        L{cli.admin_query}) gives for C{action}, asking the broker's
        remoting port (or C{factory}'s server) in memory.
        """
        d = self.ask(action, factory)
        return self.successResultOf(d)

    def ask(self, action: str, factory: Any = None) -> Any:
        client_reactor = MemoryReactorClock()
        client = RemotingClient(client_reactor, "tcp:host=127.0.0.1:port=10911", name="127.0.0.1:10911")
        d = ensureDeferred(cli.admin_run(client, "127.0.0.1:10911", action, 3.0))
        (dialled,) = client_reactor.tcpClients
        protocol = dialled[2].buildProtocol(IPv4Address("TCP", "127.0.0.1", 10911))
        server = (factory or self.remoting_factory()).buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        pump = connect(
            server, FakeTransport(server, isServer=True),
            protocol, FakeTransport(protocol, isServer=False),
        )
        for _ in range(10):
            pump.flush()
            client_reactor.advance(0.01)
            self.reactor.advance(0.01)
        self.assertFalse(client.running)
        return d

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

    def refused_at(self, when: float, advance: float) -> str:
        """
        L{cli.admin_run}'s one line when the connection is refused
        C{when} seconds in (its deadline: 3 s), the clock advanced by
        C{advance} in one step; the client is stopped after it.
        """
        client_reactor = MemoryReactorClock()
        client = RemotingClient(client_reactor, "tcp:host=127.0.0.1:port=10911", name="127.0.0.1:10911")
        d = ensureDeferred(cli.admin_run(client, "127.0.0.1:10911", "topics", 3.0))
        connector = client_reactor.connectors[0]
        factory = client_reactor.tcpClients[0][2]
        client_reactor.callLater(
            when, factory.clientConnectionFailed, connector, Failure(ConnectionRefusedError())
        )
        client_reactor.advance(advance)
        failure = self.failureResultOf(d, cli._CommandError)
        self.assertFalse(client.running)
        message = str(failure.value)
        self.assertNotIn("\n", message)
        return message

    def test_refused(self) -> None:
        """
        A refused connection is one line naming the address, delivered
        after ClientService's call stack (the client is stopped at once,
        without the reentrant stop ClientService refuses); refused before
        the deadline, in the same advance of the clock, it is still the
        refusal; refused after, a timeout.
        """
        self.assertTrue(
            self.refused_at(0, 0).startswith(
                "broker 127.0.0.1:10911: cannot connect to 127.0.0.1:10911 for "
                "GET_ALL_TOPIC_CONFIG (21): ConnectionRefusedError"
            )
        )
        self.assertIn("cannot connect to", self.refused_at(1, 3))
        self.assertEqual(
            self.refused_at(4, 3),
            "broker 127.0.0.1:10911: no response to GET_ALL_TOPIC_CONFIG (21) from "
            "127.0.0.1:10911 within 3 s",
        )

    def answering(self, code: int, response: Any) -> RemotingFactory:
        """A server answering C{code} with C{response(request)}."""
        return RemotingFactory(
            Dispatcher({code: lambda command, peer: response(command)}), self.reactor
        )

    def test_not_success(self) -> None:
        """
        An answer other than SUCCESS is one line naming the broker, the
        code asked, the response code's name and number and the remark
        (its line breaks made spaces).
        """
        factory = self.answering(
            RequestCode.GET_ALL_TOPIC_CONFIG,
            lambda c: make_response(c, ResponseCode.SYSTEM_ERROR, "no topics\n\tat Foo.bar"),
        )
        failure = self.failureResultOf(self.ask("topics", factory), cli._CommandError)
        self.assertEqual(
            str(failure.value),
            "broker 127.0.0.1:10911 answered GET_ALL_TOPIC_CONFIG (21) with SYSTEM_ERROR (1): "
            "no topics at Foo.bar",
        )
        factory = self.answering(
            RequestCode.GET_ALL_CONSUMER_OFFSET, lambda c: make_response(c, 299, None)
        )
        failure = self.failureResultOf(self.ask("consumer-offsets", factory), cli._CommandError)
        self.assertEqual(
            str(failure.value),
            "broker 127.0.0.1:10911 answered GET_ALL_CONSUMER_OFFSET (43) with unknown code (299): "
            "no remark",
        )
        # (A genuine 4.9.8 broker's answer to a code it does not serve.)
        serves_nothing = RemotingFactory(Dispatcher({}), self.reactor)
        failure = self.failureResultOf(self.ask("broker-status", serves_nothing), cli._CommandError)
        self.assertEqual(
            str(failure.value),
            "broker 127.0.0.1:10911 answered GET_BROKER_RUNTIME_INFO (28) with "
            "REQUEST_CODE_NOT_SUPPORTED (3): request type 28 not supported",
        )

    def test_unreadable_body(self) -> None:
        """
        A SUCCESS whose body is not the table asked for (not UTF-8, not
        fastjson, another shape, empty) is one line naming the broker,
        the code and what is wrong with the body.
        """
        cases = [
            ("topics", b"", "is empty"),
            ("topics", b"\xff{}", "is not UTF-8 at byte 0"),
            ("topics", b'{"topicConfigTable":{', "does not parse: line 1 column 22: unexpected end of text"),
            ("topics", b"[1,2]", "is not a JSON object with topicConfigTable but an array"),
            ("topics", b'{"offsetTable":{}}', "has no topicConfigTable object"),
            ("topics", b'{"topicConfigTable":{"T":{"perm":"rw"}}}', "does not parse: topic 'T': perm is 'rw'"),
            ("consumer-offsets", b'{"topicConfigTable":{}}', "has no offsetTable object"),
            ("consumer-offsets", b'{"offsetTable":{"T@g":{0:"x"}}}', "does not parse: offsets of 'T@g'"),
            ("broker-status", b'{"table":5}', "has table as a number, not an object"),
            ("broker-status", b'{"x":{}}', "has no table object"),
            ("broker-status", b'{"table":{"a":"1","b":{"c":1}}}', "has table entries that are not text: b"),
        ]
        for action, body, needle in cases:
            code = cli._ADMIN_CODES[action]
            factory = self.answering(
                code, lambda c, body=body: make_response(c, ResponseCode.SUCCESS, body=body)  # type: ignore[misc]
            )
            message = str(self.failureResultOf(self.ask(action, factory), cli._CommandError).value)
            self.assertTrue(
                message.startswith(f"broker 127.0.0.1:10911: the body of {RequestCode(code).name} ({code}) "),
                message,
            )
            self.assertIn(needle, message)
            self.assertNotIn("\n", message)
        factory = self.answering(
            28, lambda c: make_response(c, ResponseCode.SUCCESS, body=b'{"table":{"b":2,"a":"x","t":true}}')
        )
        self.assertEqual(self.query("broker-status", factory), {"a": "x", "b": "2", "t": "true"})

    def test_main_one_line(self) -> None:
        """
        C{rmqha admin} prints the one line on stderr, no traceback, and
        exits 1.
        """
        factory = self.answering(
            RequestCode.GET_ALL_TOPIC_CONFIG,
            lambda c: make_response(c, ResponseCode.SUCCESS, body=b"[]"),
        )

        def run_admin(args: Any) -> Any:
            self.failureResultOf(self.ask(args.action, factory), cli._CommandError).raiseException()

        self.patch(cli, "_run_admin", run_admin)
        out, err = io.StringIO(), io.StringIO()
        status = cli.main(["admin", "topics", "--broker", "127.0.0.1:10911"], out, err)
        self.assertEqual(status, 1)
        self.assertEqual(
            err.getvalue(),
            "rmqha: error: broker 127.0.0.1:10911: the body of GET_ALL_TOPIC_CONFIG (21) is not a "
            "JSON object with topicConfigTable but an array\n",
        )
        self.assertEqual(out.getvalue(), "")

    def test_bad_broker_argument(self) -> None:
        err = io.StringIO()
        self.assertEqual(cli.main(["admin", "topics", "--broker", "nowhere"], io.StringIO(), err), 2)
        self.assertIn("is not HOST:PORT", err.getvalue())
