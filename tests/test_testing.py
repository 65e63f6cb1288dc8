"""
Tests for L{rmqha.testing}, the public fakes: the in-memory master/slave
connection (plain, TLS, through a fault) and L{StringEndpoint}.
"""

from __future__ import annotations

import os
import re

from twisted.internet import ssl
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.trial.reporter import TestResult
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rmqha import certs
from rmqha.ha.master import MasterConnection, MasterFactory
from rmqha.ha.slave import SlaveConnection, SlaveFactory
from rmqha.testing import (
    MASTER_ADDRESS,
    SLAVE_ADDRESS,
    StringEndpoint,
    connect_in_memory,
)
from rmqha.tls import PeerPolicy, TLSFiles, server_context

from tests._helpers import make_message, open_store, segment_files

SEGMENT = 64 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Echo(Protocol):
    """
    Writes back whatever it receives: with two of them a conversation
    never goes quiet.
    """

    def connectionMade(self) -> None:
        self.transport.write(b"ping")  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[union-attr]


class _Recorder(Protocol):
    """
    Keeps what it receives and why its connection ended; hangs up on
    C{BYE}.
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.lost: list[object] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)
        if b"BYE" in data:
            self.transport.loseConnection()  # type: ignore[union-attr]

    def connectionLost(self, reason: object = None) -> None:
        self.lost.append(reason)


class ConnectInMemoryTests(SynchronousTestCase):
    """
    L{connect_in_memory} joins a master and a slave on a clock.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.source = open_store(self, segment_size=SEGMENT)
        self.replica = open_store(self, segment_size=SEGMENT)
        for _ in range(300):
            self.source.put(make_message(b"m" * 500))

    def assertReplicated(self) -> None:
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(
            segment_files(self.replica.store_dir), segment_files(self.source.store_dir)
        )

    def test_plain_replicates(self) -> None:
        """
        Over plain in-memory TCP the slave gets the master's whole log;
        C{master} and C{slave} are the protocols the factories built, each
        seeing the other's address.
        """
        master = MasterFactory(self.source, self.clock)
        connection = connect_in_memory(master, SlaveFactory(self.replica, self.clock), self.clock)
        self.assertIsInstance(connection.master, MasterConnection)
        self.assertIsInstance(connection.slave, SlaveConnection)
        self.assertIs(connection.server, connection.master)
        self.assertEqual(connection.server_transport.getPeer(), SLAVE_ADDRESS)
        self.assertEqual(connection.client_transport.getPeer(), MASTER_ADDRESS)
        connection.slave.send_report()
        connection.flush()
        self.assertReplicated()
        (status,) = master.slaves()
        self.assertEqual(status.ack_offset, self.source.max_offset)
        connection.hang_up()
        self.assertTrue(connection.dropped)
        self.assertEqual(master.slaves(), [])

    def test_tls_replicates(self) -> None:
        """
        With TLS on both sides (L{TLSMemoryBIOFactory} on the same clock)
        the handshake completes inside C{flush}, the master verifies the
        slave's certificate, and the log is replicated; C{server} and
        C{client} are the TLS layers around C{master} and C{slave}.
        """
        directory = self.mktemp()
        os.makedirs(directory)
        ca = certs.make_ca()
        certs.write_pair(ca, directory, "ca")
        ca_pem = os.path.join(directory, "ca.pem")
        master_files = TLSFiles(
            *certs.write_pair(
                certs.issue(ca, "master", ["master"], server=True), directory, "master"
            ),
            ca_pem,
        )
        slave_files = TLSFiles(
            *certs.write_pair(certs.issue(ca, "s1", ["s1"], client=True), directory, "s1"),
            ca_pem,
        )
        key, cert, _ = slave_files.key_pair()
        master = MasterFactory(self.source, self.clock)
        connection = connect_in_memory(
            master,
            SlaveFactory(self.replica, self.clock),
            self.clock,
            master_tls=server_context(master_files, PeerPolicy(require_client_cert=True)),
            slave_tls=ssl.optionsForClientTLS(
                "master",
                trustRoot=slave_files.trust_root(),
                extraCertificateOptions={"privateKey": key, "certificate": cert},
            ),
        )
        self.assertIsInstance(connection.server, TLSMemoryBIOProtocol)
        self.assertIsInstance(connection.client, TLSMemoryBIOProtocol)
        self.assertIsInstance(connection.master, MasterConnection)
        self.assertIsInstance(connection.slave, SlaveConnection)
        connection.slave.send_report()
        connection.flush()
        self.assertReplicated()
        (status,) = master.slaves()
        self.assertEqual((status.transport, status.identity), ("tls", "s1"))
        connection.hang_up()

    def test_fault_and_read_size(self) -> None:
        """
        A fault sees every read (of at most C{read_size} bytes) with its
        direction and decides what arrives; once a side drops, nothing
        more is delivered and C{hang_up} tells both sides.
        """
        seen: list[tuple[bytes, bool]] = []

        def fault(data: bytes, to_slave: bool) -> bytes:
            seen.append((data, to_slave))
            return data.upper()

        connection = connect_in_memory(
            Factory.forProtocol(_Recorder),
            Factory.forProtocol(_Recorder),
            self.clock,
            fault=fault,
            read_size=3,
        )
        connection.client_transport.write(b"hello")
        connection.server_transport.write(b"bye then")
        connection.flush()
        self.assertEqual(seen, [(b"hel", False), (b"lo", False), (b"bye", True)])
        self.assertEqual(connection.master.received, [b"HEL", b"LO"])
        self.assertEqual(connection.slave.received, [b"BYE"])
        self.assertTrue(connection.dropped)
        connection.hang_up()
        self.assertEqual((len(connection.master.lost), len(connection.slave.lost)), (1, 1))
        connection.hang_up()
        self.assertEqual((len(connection.master.lost), len(connection.slave.lost)), (1, 1))

    def test_endless_conversation(self) -> None:
        """
        C{flush} gives up with C{AssertionError} on a conversation that
        never goes quiet, instead of spinning forever.
        """
        connection = connect_in_memory(
            Factory.forProtocol(_Echo), Factory.forProtocol(_Echo), self.clock
        )
        self.assertRaises(AssertionError, connection.flush, limit=50)


class StringEndpointTests(SynchronousTestCase):
    """
    L{StringEndpoint} connects protocols to C{StringTransport}s.
    """

    def test_connects(self) -> None:
        """
        Each connection is a new protocol on a C{StringTransport}, kept in
        C{connected}; the endpoint provides L{IStreamClientEndpoint}.
        """
        endpoint = StringEndpoint()
        verifyObject(IStreamClientEndpoint, endpoint)
        protocol = self.successResultOf(endpoint.connect(Factory.forProtocol(_Echo)))
        ((connected, transport),) = endpoint.connected
        self.assertIs(connected, protocol)
        self.assertEqual(transport.value(), b"ping")

    def test_refuses(self) -> None:
        """
        While C{refuse} is set, connecting fails with
        L{ConnectionRefusedError} and nothing is built.
        """
        endpoint = StringEndpoint(refuse=True)
        self.failureResultOf(
            endpoint.connect(Factory.forProtocol(_Echo)), ConnectionRefusedError
        )
        self.assertEqual(endpoint.connected, [])


class DocumentedExampleTests(SynchronousTestCase):
    """
    The example in docs/embedding.md ("Testing code that embeds rmqha")
    passes as written.
    """

    def test_example_passes(self) -> None:
        """
        The documented C{ReplicationTests} runs green, so the public
        fakes' documentation cannot drift from them.
        """
        with open(os.path.join(ROOT, "docs", "embedding.md"), encoding="utf-8") as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)
        (block,) = [b for b in blocks if "rmqha.testing" in b]
        namespace: dict[str, object] = {"__name__": "docs_embedding_testing"}
        exec(compile(block, "docs/embedding.md", "exec"), namespace)
        case = namespace["ReplicationTests"]("test_slave_catches_up")  # type: ignore[operator]
        previous = os.getcwd()
        workdir = os.path.abspath(self.mktemp())
        os.makedirs(workdir)
        os.chdir(workdir)
        self.addCleanup(os.chdir, previous)
        result = TestResult()
        case.run(result)
        self.assertEqual((result.errors, result.failures), ([], []))
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(result.testsRun, 1)
