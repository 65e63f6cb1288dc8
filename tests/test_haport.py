"""
Tests for a failover node's HA port held for its whole life
(L{rmqha.ha.haport}, docs/failover.md "The HA port has an owner"): the
NOT_MASTER answer on the wire, the gate's protocol, the slave's reading of
it, and a coordinated broker that binds its port at start and keeps it in
every role.
"""

from __future__ import annotations

import struct

from hypothesis import given, strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.ha._wire import (
    CONTROL_PROBE,
    MAX_NOT_MASTER_REASON,
    ChecksumError,
    ProtocolError,
    decode_not_master,
    encode_code,
    encode_identify,
    encode_not_master,
)
from rmqha.ha.control import ControlClient, NotTheMaster
from rmqha.ha.haport import GREETING_TIMEOUT, HAGate
from rmqha.ha.master import MasterConnection
from rmqha.store.commitlog import CommitLog

from tests._helpers import fixed_clock


def _feed_in_chunks(message: bytes, sizes: list[int]) -> tuple[str, int] | None:
    buffer = bytearray()
    found = None
    position = 0
    for size in sizes:
        buffer += message[position : position + size]
        position += size
        found = decode_not_master(buffer)
        if found is not None:
            break
    if found is None and position < len(message):
        buffer += message[position:]
        found = decode_not_master(buffer)
    return found


class NotMasterWireTests(SynchronousTestCase):
    def test_round_trip_one_byte_at_a_time(self) -> None:
        message = encode_not_master("this node is not the master: it stands by")
        found = _feed_in_chunks(message, [1] * len(message))
        self.assertEqual(found, ("this node is not the master: it stands by", len(message)))

    @given(st.text(max_size=600), st.lists(st.integers(1, 64), max_size=40))
    def test_any_reason_any_chunking(self, reason: str, sizes: list[int]) -> None:
        message = encode_not_master(reason)
        found = _feed_in_chunks(message, sizes)
        assert found is not None
        text, size = found
        self.assertEqual(size, len(message))
        self.assertLessEqual(len(text.encode()), MAX_NOT_MASTER_REASON)
        self.assertTrue(text.isprintable())

    def test_damaged(self) -> None:
        message = bytearray(encode_not_master("not the master"))
        message[12] ^= 0x20
        self.assertRaises(ChecksumError, decode_not_master, message)

    def test_impossible_length(self) -> None:
        message = encode_not_master("x")
        head = bytearray(message[:10])
        head[8:10] = struct.pack(">H", MAX_NOT_MASTER_REASON + 1)
        error = self.assertRaises(ProtocolError, decode_not_master, head)
        self.assertIn("limit", str(error))


class GateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.gate = HAGate(self.clock, lambda: "this node is not the master: it stands by")

    def connect(self) -> tuple[object, StringTransport]:
        protocol = self.gate.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        transport = StringTransport()
        protocol.makeConnection(transport)
        return protocol, transport

    def test_rmqha_peer_told_why(self) -> None:
        """
        A control probe, IDENTIFY or any rmqha greeting is answered with
        NOT_MASTER and the reason, then the connection closes.
        """
        for greeting in (encode_code(CONTROL_PROBE), encode_identify("b")):
            protocol, transport = self.connect()
            for i in range(len(greeting)):  # (one byte at a time)
                protocol.dataReceived(greeting[i : i + 1])  # type: ignore[attr-defined]
            found = decode_not_master(transport.value())
            assert found is not None
            self.assertEqual(found[0], "this node is not the master: it stands by")
            self.assertTrue(transport.disconnecting)

    def test_classic_slave_closed(self) -> None:
        """
        A classic slave's first report (a RocketMQ slave) is closed on,
        with nothing sent: it cannot read NOT_MASTER.
        """
        protocol, transport = self.connect()
        protocol.dataReceived(struct.pack(">q", 0))  # type: ignore[attr-defined]
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)

    def test_silent_peer_closed(self) -> None:
        """
        A peer that sends nothing is closed after GREETING_TIMEOUT; one
        that sends megabytes is read 8 bytes deep.
        """
        protocol, transport = self.connect()
        self.clock.advance(GREETING_TIMEOUT)
        self.assertTrue(transport.disconnecting)
        protocol.connectionLost()  # type: ignore[attr-defined]
        self.assertEqual(self.clock.getDelayedCalls(), [])
        protocol, transport = self.connect()
        protocol.dataReceived(b"\xff" * (1 << 20))  # type: ignore[attr-defined]
        self.assertTrue(transport.disconnecting)
        protocol.connectionLost()  # type: ignore[attr-defined]

    def test_master_factory_while_master(self) -> None:
        """
        While a master factory is set, the gate builds its connections.
        """

        class Factory:
            def buildProtocol(self, addr: object) -> str:
                return "master connection"

        self.gate.factory = Factory()  # type: ignore[assignment]
        self.assertEqual(self.gate.buildProtocol(None), "master connection")


class ProbeReadsNotMasterTests(SynchronousTestCase):
    def test_probe_fails_with_the_reason(self) -> None:
        """
        The slave's control client, answered NOT_MASTER, fails its probe
        with the reason (a CheckFailed: retried after a back-off, shown as
        the slave's problem, never a traceback).
        """
        client = ControlClient(Clock())
        transport = StringTransport()
        client.makeConnection(transport)
        message = encode_not_master("this node is not the master: it is a slave of x")
        for i in range(len(message)):
            client.dataReceived(message[i : i + 1])
        failure = self.failureResultOf(client.info, NotTheMaster)
        self.assertEqual(
            failure.getErrorMessage(), "this node is not the master: it is a slave of x"
        )
        self.assertTrue(transport.disconnecting)


class HeldPortTests(SynchronousTestCase):
    """
    A coordinated broker listens on its HA port at start and keeps the
    same listening port through every role change.
    """

    def test_port_held_in_every_role(self) -> None:
        reactor = MemoryReactorClock()
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(ha_listen="tcp:10912:interface=127.0.0.1", scrub_rate=0),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            fd_limit=lambda: 4096,
            coordinated=True,
        )
        broker.startService()
        self.assertEqual([port[0] for port in reactor.tcpServers], [10912])
        gate = reactor.tcpServers[0][1]
        # Standing by: an rmqha peer is told so.
        protocol = gate.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(encode_code(CONTROL_PROBE))
        found = decode_not_master(transport.value())
        assert found is not None
        self.assertIn("stands by", found[0])
        # Master: the same port now serves slaves; no second listen.
        self.successResultOf(broker.become_master(Role.SYNC_MASTER))
        self.assertEqual(len(reactor.tcpServers), 1)
        connection = gate.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40002))
        self.assertIsInstance(getattr(connection, "wrappedProtocol", connection), MasterConnection)
        # Stepping down: still held, refusing again.
        self.successResultOf(broker.stand_by())
        self.assertEqual(len(reactor.tcpServers), 1)
        protocol = gate.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40003))
        self.assertNotIsInstance(
            getattr(protocol, "wrappedProtocol", protocol), MasterConnection
        )
        self.successResultOf(broker.stopService())

