"""
Tests for replica identity (issue 12, item 15): the quorum counts
replicas, not connections.  A replica is its TLS certificate's name, else
the id it declared with IDENTIFY (unauthenticated), else its address.
"""

from __future__ import annotations

import os
import struct

from twisted.internet.defer import succeed
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CHECKED_ACK,
    CHECKED_HELLO,
    FEATURE_CHECKED_FRAMING,
    FEATURE_IDENTIFY,
    ChecksumError,
    ProtocolError,
    decode_identify,
    encode_code,
    encode_control_info,
    encode_identify,
    encode_report,
)
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog
from rmqha.ha.master import MasterConnection, MasterFactory
from rmqha.ha.slave import SlaveFactory, load_replica_id

from rmqha.testing import StringEndpoint
from tests._helpers import fixed_clock
from tests.test_master import MasterTestCase, report


class IdentifyMessageTests(SynchronousTestCase):
    """
    The IDENTIFY message, bytes in and out.
    """

    def test_round_trip_and_partial(self) -> None:
        """
        An id comes back with the bytes it took; a partial message is not
        decoded yet.
        """
        message = encode_identify("replica-é") + b"more"
        size = len(message) - 4
        self.assertEqual(decode_identify(message), ("replica-é", size))
        for cut in range(size):
            self.assertIsNone(decode_identify(message[:cut]))

    def test_bad_messages(self) -> None:
        """
        A damaged message fails its CRC; an impossible length or id is a
        protocol error; an id we would not send is refused at encoding.
        """
        message = bytearray(encode_identify("abc"))
        message[11] ^= 1
        self.assertRaises(ChecksumError, decode_identify, message)
        head = bytes(encode_identify("abc")[:8])
        self.assertRaises(ProtocolError, decode_identify, head + struct.pack(">H", 0))
        self.assertRaises(ProtocolError, decode_identify, head + struct.pack(">H", 256))
        for bad in ("", "x" * 256, "a\nb"):
            self.assertRaises(ValueError, encode_identify, bad)


class QuorumIdentityTests(MasterTestCase):
    """
    Each replica counts once in the master's acks.
    """

    def replicate(
        self, factory: MasterFactory, port: int, replica_id: str | None = None,
        certificate: str | None = None,
    ) -> tuple[MasterConnection, StringTransport]:
        connection, transport = self.connect(factory, port)
        # (What handshakeCompleted records from a verified certificate.)
        connection.identity = certificate
        hello = encode_identify(replica_id) if replica_id is not None else b""
        connection.dataReceived(hello + report(0))
        return connection, transport

    def test_same_certificate_counted_once(self) -> None:
        """
        Two connections presenting the same certificate name are one
        replica: the second replaces the first, and one ack counts.
        """
        self.fill(3)
        factory = self.factory()
        first, first_transport = self.replicate(factory, 40001, certificate="slave-a")
        with capturedLogs() as events:
            second, _ = self.replicate(factory, 40002, certificate="slave-a")
        self.assertTrue(first_transport.disconnecting)
        self.assertIn(
            "replaced by a newer connection of certificate slave-a from 127.0.0.1:40002",
            "\n".join(formatEvent(e) for e in events),
        )
        self.assertEqual(factory.replicas.ack_offsets(), [0])
        first.connectionLost()
        self.assertEqual([s.peer for s in factory.slaves()], ["127.0.0.1:40002"])

    def test_certificate_wins_over_declared_id(self) -> None:
        """
        Under TLS the certificate is the identity: declaring different ids
        with the same certificate does not make two replicas.
        """
        self.fill(3)
        factory = self.factory()
        first, first_transport = self.replicate(factory, 40001, "x", certificate="slave-a")
        self.replicate(factory, 40002, "y", certificate="slave-a")
        self.assertTrue(first_transport.disconnecting)
        self.assertEqual(len(factory.replicas.ack_offsets()), 1)
        first.connectionLost()

    def test_same_declared_id_counted_once(self) -> None:
        """
        Plain TCP: two connections declaring the same replica id are one
        replica; the id shows in the status.
        """
        self.fill(3)
        factory = self.factory()
        first, first_transport = self.replicate(factory, 40001, "r1")
        second, second_transport = self.replicate(factory, 40002, "r1")
        self.assertTrue(first_transport.disconnecting)
        self.assertFalse(second_transport.disconnecting)
        self.assertEqual(factory.replicas.ack_offsets(), [0])
        first.connectionLost()
        self.assertEqual([s.replica_id for s in factory.slaves()], ["r1"])

    def test_different_ids_and_classic_slaves_count_apart(self) -> None:
        """
        Different declared ids are different replicas; slaves that declare
        nothing (classic) count per connection, as before.
        """
        self.fill(3)
        factory = self.factory()
        transports = [
            self.replicate(factory, 40001, "r1")[1],
            self.replicate(factory, 40002, "r2")[1],
            self.replicate(factory, 40003)[1],
            self.replicate(factory, 40004)[1],
        ]
        self.assertFalse(any(t.disconnecting for t in transports))
        self.assertEqual(factory.replicas.ack_offsets(), [0, 0, 0, 0])

    def test_identify_split_then_checked_hello(self) -> None:
        """
        IDENTIFY cut into single bytes, then CHECKED_HELLO: the id is taken
        and checked framing goes on as without it.
        """
        self.fill(3)
        factory = self.factory()
        connection, transport = self.connect(factory)
        for byte in encode_identify("r1") + encode_code(CHECKED_HELLO):
            connection.dataReceived(bytes([byte]))
        connection.dataReceived(encode_report(0, checked=True))
        self.assertEqual(connection.replica_id, "r1")
        self.assertTrue(transport.value().startswith(encode_code(CHECKED_ACK)))
        self.assertEqual(factory.replicas.ack_offsets(), [0])

    def test_damaged_identify_drops(self) -> None:
        """
        An IDENTIFY that fails its CRC drops the connection and counts as
        a checksum failure.
        """
        factory = self.factory()
        connection, transport = self.connect(factory)
        message = bytearray(encode_identify("r1"))
        message[10] ^= 0x20
        connection.dataReceived(bytes(message))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(factory.checksum_failures, 1)


class SlaveIdentityTests(SynchronousTestCase):
    """
    The slave declares its persistent replica id, only to a master that
    offered IDENTIFY.
    """

    def test_replica_id_persists(self) -> None:
        """
        The id is created once in the store's rmqha/replica-id and read
        back afterwards; a bad file is a one-line error naming it.
        """
        store = self.mktemp()
        first = load_replica_id(store)
        self.assertEqual(load_replica_id(store), first)
        path = os.path.join(store, "rmqha", "replica-id")
        with open(path, "w") as f:
            f.write("\n")
        e = self.assertRaises(ValueError, load_replica_id, store)
        self.assertIn(path, str(e))

    def test_first_write_is_identify(self) -> None:
        """
        With an identity, the first bytes of a replication connection are
        IDENTIFY, then CHECKED_HELLO and the report; later reports carry
        neither.
        """
        from tests._helpers import open_store

        replica = open_store(self, segment_size=64 * 1024)
        factory = SlaveFactory(replica, MemoryReactorClock())
        factory.checked = True
        factory.identity = "r1"
        connection = factory.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(connection.connectionLost)
        connection.send_report()
        self.assertEqual(
            transport.value(),
            encode_identify("r1") + encode_code(CHECKED_HELLO) + encode_report(0, checked=True),
        )
        transport.clear()
        connection.send_report()
        self.assertEqual(transport.value(), encode_report(0, checked=True))

    def broker_replication_start(self, features: int) -> tuple[bytes, str]:
        reactor = MemoryReactorClock()
        endpoint = StringEndpoint()
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.SLAVE, master_endpoint=endpoint),  # type: ignore[arg-type]
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        client, _ = endpoint.connected[0]
        client.dataReceived(encode_control_info(0, 0, 64 * 1024, features))
        _, replication = endpoint.connected[-1]
        return replication.value(), store

    def test_broker_declares_id_when_offered(self) -> None:
        """
        A master offering IDENTIFY gets the store's replica id first.
        """
        sent, store = self.broker_replication_start(FEATURE_CHECKED_FRAMING | FEATURE_IDENTIFY)
        self.assertTrue(sent.startswith(encode_identify(load_replica_id(store))))

    def test_broker_silent_when_not_offered(self) -> None:
        """
        A master that did not offer IDENTIFY (an older rmqha master) never
        gets it: a negative code it does not know would be refused.
        """
        sent, _ = self.broker_replication_start(FEATURE_CHECKED_FRAMING)
        self.assertTrue(sent.startswith(encode_code(CHECKED_HELLO)))
