"""
Tests for L{rmqha._tlsbio}: rmqha's TLS layer (a Twisted
C{BufferingTLSTransport} that encrypts a write in one pass and hands over a
read's records whole), between two in-memory peers with certificates from
L{rmqha.certs}; and that L{rmqha.tls}'s endpoints use it.
"""

from __future__ import annotations

from typing import Any

from OpenSSL import SSL
from twisted.internet import ssl
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from twisted.internet.interfaces import IPushProducer

from rmqha import _tlsbio
from rmqha._tlsbio import TLSFactory, TLSProtocol
from rmqha.testing import StringEndpoint
from rmqha.tls import PeerPolicy, _TLSClientEndpoint, server_context, server_endpoint

from tests.test_tls import PKI

FRAME = bytes(range(256)) * 1024  # 256 KiB: a catch-up frame's body
HEADER = b"H" * 36


class Recorder(Protocol):
    """
    Keeps every C{dataReceived} and the reason the connection was lost.
    """

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.lost: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.pieces.append(data)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        self.lost = reason


class Wire(StringTransport):
    """
    A transport keeping each write apart (what reached the socket in one
    call).
    """

    def __init__(self) -> None:
        StringTransport.__init__(self)
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writeSequence(self, seq: Any) -> None:
        self.writes.append(b"".join(seq))

    def take(self) -> bytes:
        data, self.writes = b"".join(self.writes), []
        return data


@implementer(IPushProducer)
class Producer:
    def __init__(self) -> None:
        self.events: list[str] = []

    def pauseProducing(self) -> None:
        self.events.append("pause")

    def resumeProducing(self) -> None:
        self.events.append("resume")

    def stopProducing(self) -> None:
        self.events.append("stop")


class Peers:
    """
    A server and a client L{TLSProtocol} (mutual TLS, as the HA port),
    handshaken; C{server_wire}/C{client_wire} hold what each wrote since.
    """

    def __init__(self, case: SynchronousTestCase) -> None:
        pki = PKI(case.mktemp())
        master, slave = pki.master(), pki.slave("s1")
        key, certificate, _ = slave.key_pair()
        client_options = ssl.optionsForClientTLS(
            "master",
            trustRoot=slave.trust_root(),
            extraCertificateOptions={"privateKey": key, "certificate": certificate},
        )
        self.clock = Clock()
        server_factory = TLSFactory(
            server_context(master, PeerPolicy(require_client_cert=True)),
            False,
            Factory.forProtocol(Recorder),
            clock=self.clock,
        )
        client_factory = TLSFactory(
            client_options, True, Factory.forProtocol(Recorder), clock=self.clock
        )
        self.server: Any = server_factory.buildProtocol(None)
        self.client: Any = client_factory.buildProtocol(None)
        self.server_wire, self.client_wire = Wire(), Wire()
        self.server.makeConnection(self.server_wire)
        self.client.makeConnection(self.client_wire)
        for _ in range(5):
            self.to_server()
            self.to_client()
        assert self.server._handshakeDone and self.client._handshakeDone
        self.server_app: Recorder = self.server.wrappedProtocol
        self.client_app: Recorder = self.client.wrappedProtocol

    def to_server(self) -> None:
        """Deliver what the client wrote as one read."""
        data = self.client_wire.take()
        if data:
            self.server.dataReceived(data)

    def to_client(self) -> None:
        """Deliver what the server wrote as one read."""
        data = self.server_wire.take()
        if data:
            self.client.dataReceived(data)


class WritePathTests(SynchronousTestCase):
    """
    How a write leaves: all its records at once.
    """

    def test_frame_is_one_transport_write(self) -> None:
        """
        A frame (header and 256 KiB body, as C{send_now} passes them) is
        encrypted and handed to the transport in one write — Twisted's
        layer writes each 16 KiB record on its own — and arrives intact.
        """
        peers = Peers(self)
        peers.server.writeSequence([HEADER, FRAME])
        self.assertEqual(len(peers.server_wire.writes), 1)
        peers.to_client()
        self.assertEqual(b"".join(peers.client_app.pieces), HEADER + FRAME)

    def test_write_sequence_is_not_delayed(self) -> None:
        """
        C{writeSequence} (a slave's report, a heartbeat) goes out at once,
        not at the end of the reactor turn; a plain C{write} keeps
        Twisted's aggregation of small writes until then.
        """
        peers = Peers(self)
        peers.client.writeSequence([b"report", b"!"])
        self.assertEqual(len(peers.client_wire.writes), 1)
        peers.client.write(b"small")
        self.assertEqual(len(peers.client_wire.writes), 1)
        peers.clock.advance(0)
        self.assertEqual(len(peers.client_wire.writes), 2)
        peers.to_server()
        self.assertEqual(b"".join(peers.server_app.pieces), b"report!small")
        self.assertEqual(peers.clock.getDelayedCalls(), [])

    def test_aggregated_writes_go_first(self) -> None:
        """
        Small writes still held by the aggregation leave before a
        C{writeSequence} that follows them: order is kept.
        """
        peers = Peers(self)
        peers.server.write(b"first ")
        peers.server.writeSequence([HEADER, FRAME])
        peers.clock.advance(0)
        peers.to_client()
        self.assertEqual(b"".join(peers.client_app.pieces), b"first " + HEADER + FRAME)

    def test_write_waiting_for_a_read_pauses_the_producer(self) -> None:
        """
        When OpenSSL cannot encrypt before it reads (renegotiation), what
        was encrypted leaves, the rest waits with the producer paused, and
        goes out, in order, with the producer resumed, once a read lets it.
        """
        peers = Peers(self)
        producer = Producer()
        peers.server.registerProducer(producer, True)
        real = peers.server._tlsConnection

        class Stalling:
            """The real connection, refusing to encrypt after 20 KiB."""

            def __init__(self) -> None:
                self.budget = 20 * 1024

            def send(self, data: Any) -> int:
                if self.budget <= 0:
                    raise SSL.WantReadError()
                taken = min(len(data), self.budget, 1 << 14)
                self.budget -= taken
                return int(real.send(data[:taken]))

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        peers.server._tlsConnection = Stalling()
        peers.server.writeSequence([HEADER, FRAME])
        self.assertEqual(producer.events, ["pause"])
        peers.to_client()
        self.assertEqual(len(b"".join(peers.client_app.pieces)), 20 * 1024)
        peers.server._tlsConnection = real
        peers.client.writeSequence([b"report"])
        peers.to_server()
        self.assertEqual(producer.events, ["pause", "resume"])
        peers.to_client()
        self.assertEqual(b"".join(peers.client_app.pieces), HEADER + FRAME)

    def test_close_after_write(self) -> None:
        """
        C{loseConnection} after a large write sends the data, then the
        TLS close: the peer gets everything, in one piece, and shuts TLS
        down in turn.
        """
        peers = Peers(self)
        peers.server.writeSequence([HEADER, FRAME])
        peers.server.loseConnection()
        peers.to_client()
        self.assertEqual(peers.client_app.pieces, [HEADER + FRAME])
        self.assertTrue(peers.client_wire.disconnecting)
        self.assertFalse(peers.server_wire.disconnecting)
        peers.to_server()
        self.assertTrue(peers.server_wire.disconnecting)


class ReadPathTests(SynchronousTestCase):
    """
    How a read arrives: the records it completed, in one piece.
    """

    def test_read_of_many_records_is_one_piece(self) -> None:
        """
        Every record one socket read completes is handed over in one
        C{dataReceived} (Twisted's layer: one per 16 KiB record).
        """
        peers = Peers(self)
        for i in range(4):
            peers.server.writeSequence([HEADER, FRAME[: 50000 + i]])
        peers.to_client()
        self.assertEqual(
            peers.client_app.pieces,
            [b"".join(HEADER + FRAME[: 50000 + i] for i in range(4))],
        )

    def test_record_cut_across_reads(self) -> None:
        """
        A read ending inside a record hands over the whole records before
        it; the cut record comes with the next read.
        """
        peers = Peers(self)
        peers.server.writeSequence([HEADER, FRAME])
        wire = peers.server_wire.take()
        peers.client.dataReceived(wire[:100000])
        peers.client.dataReceived(wire[100000:])
        self.assertEqual(len(peers.client_app.pieces), 2)
        self.assertEqual(b"".join(peers.client_app.pieces), HEADER + FRAME)

    def test_close_in_the_same_read_as_data(self) -> None:
        """
        Data and the peer's TLS close in one read: the data is handed
        over first, then TLS is shut down (the close answered, the
        transport closed).
        """
        peers = Peers(self)
        peers.server.writeSequence([b"last words"])
        peers.server.loseConnection()
        peers.to_client()
        self.assertEqual(peers.client_app.pieces, [b"last words"])
        self.assertTrue(peers.client_wire.disconnecting)
        self.assertNotEqual(peers.client_wire.take(), b"")  # its close_notify

    def test_bad_record_after_good_ones(self) -> None:
        """
        A corrupted record: the records before it in the read are handed
        over, then the connection ends with OpenSSL's error as the reason.
        """
        peers = Peers(self)
        peers.server.writeSequence([HEADER, FRAME])
        wire = bytearray(peers.server_wire.take())
        wire[-100] ^= 1
        peers.client.dataReceived(bytes(wire))
        received = b"".join(peers.client_app.pieces)
        self.assertTrue(received)
        self.assertTrue((HEADER + FRAME).startswith(received))
        self.assertTrue(peers.client_wire.disconnecting)
        peers.client.connectionLost(Failure(ConnectionDone()))
        assert peers.client_app.lost is not None
        self.assertTrue(peers.client_app.lost.check(SSL.Error))

    def test_without_pyopenssl_bindings(self) -> None:
        """
        Without pyOpenSSL's private bindings (another version), records
        are read through its public C{recv} and a write keeps partial
        writes: slower, the same bytes, the same pieces and writes.
        """
        self.patch(_tlsbio, "_DIRECT", None)
        self.patch(_tlsbio, "_whole_writes", lambda connection: None)
        peers = Peers(self)
        peers.server.writeSequence([HEADER, FRAME])
        self.assertEqual(len(peers.server_wire.writes), 1)
        peers.server.writeSequence([b"more"])
        peers.server.loseConnection()
        peers.to_client()
        self.assertEqual(peers.client_app.pieces, [HEADER + FRAME + b"more"])
        self.assertTrue(peers.client_wire.disconnecting)


class EndpointTests(SynchronousTestCase):
    """
    L{rmqha.tls}'s endpoints speak through L{TLSProtocol}.
    """

    def test_server_endpoint(self) -> None:
        """
        C{server_endpoint} listens on TCP with a L{TLSFactory} around the
        application's factory (not C{reactor.listenSSL}'s Twisted layer).
        """
        pki = PKI(self.mktemp())
        reactor = MemoryReactorClock()
        endpoint = server_endpoint(
            reactor,
            "ssl:10912:interface=127.0.0.1",
            pki.master(),
            PeerPolicy(require_client_cert=True),
        )
        factory = Factory.forProtocol(Recorder)
        self.successResultOf(endpoint.listen(factory))
        self.assertEqual(reactor.sslServers, [])
        port, tls_factory, backlog, interface = reactor.tcpServers[0]
        self.assertEqual((port, backlog, interface), (10912, 50, "127.0.0.1"))
        self.assertIsInstance(tls_factory, TLSFactory)
        self.assertIs(tls_factory.wrappedFactory, factory)
        self.assertIs(tls_factory._clock, reactor)

    def test_client_endpoint(self) -> None:
        """
        The slave's TLS endpoint wraps its factory in a L{TLSFactory} and
        answers with the application's protocol.
        """
        pki = PKI(self.mktemp())
        inner = StringEndpoint()
        clock = Clock()
        options = ssl.optionsForClientTLS("master", trustRoot=pki.slave("s1").trust_root())
        protocol = self.successResultOf(
            _TLSClientEndpoint(options, inner, clock).connect(Factory.forProtocol(Recorder))
        )
        self.assertIsInstance(protocol, Recorder)
        tls, transport = inner.connected[0]
        self.assertIsInstance(tls, TLSProtocol)
        self.assertIs(tls.wrappedProtocol, protocol)
        self.assertNotEqual(transport.value(), b"")  # the ClientHello
