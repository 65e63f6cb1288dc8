"""
Tests for L{rmqha.ha.divergence} and the master's side of the control
extension, in memory (L{rmqha.testing.connect_in_memory}) over real
commit logs.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CONTROL_DIGEST_SIZE,
    CONTROL_HELLO,
    CONTROL_PROBE,
    CONTROL_REQUEST_SIZE,
    FEATURE_CHECKED_FRAMING,
    FEATURE_IDENTIFY,
    decode_digest_answer,
    encode_code,
    encode_digest_request,
)
from rmqha.ha.control import ControlClient, MasterInfo, range_digest
from rmqha.ha.divergence import Divergence, DivergenceKind, find_divergence
from rmqha.ha.master import MasterFactory
from rmqha.testing import MemoryConnection, connect_in_memory

from tests._helpers import make_message, open_store

SEGMENT = 64 * 1024


class DivergenceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.master = open_store(self, segment_size=SEGMENT)
        self.slave = open_store(self, segment_size=SEGMENT)
        for i in range(200):
            self.master.put(make_message(b"m" * (300 + i % 7)))

    def copy(self, end: int, source: Any = None) -> None:
        """
        The slave gets C{source}'s (the master's) bytes up to C{end}.
        """
        source = source or self.master
        position = self.slave.max_offset
        while position < end:
            chunk = source.read(position, end - position)
            self.slave.append_at(position, chunk)
            position += len(chunk)

    def session(self) -> tuple[ControlClient, MasterInfo, MemoryConnection]:
        factory = MasterFactory(self.master, self.clock)
        connection = connect_in_memory(
            factory, Factory.forProtocol(ControlClient), self.clock
        )
        connection.flush()
        client: ControlClient = connection.slave
        info = self.successResultOf(client.info)
        self.assertEqual(factory.slaves(), [])  # not a slave
        return client, info, connection

    def check(self, window: int = 4096) -> Divergence | None:
        client, info, connection = self.session()
        d: Deferred[Divergence | None] = Deferred.fromCoroutine(
            find_divergence(self.slave, client, info, window)
        )
        for _ in range(10_000):
            if d.called:
                break
            connection.flush()
        return self.successResultOf(d)

    def test_info(self) -> None:
        """
        The master answers the hello with its offsets, segment size and the
        offer of checked framing and of IDENTIFY.
        """
        _, info, _ = self.session()
        self.assertEqual(
            info,
            MasterInfo(
                0, self.master.max_offset, SEGMENT, FEATURE_CHECKED_FRAMING | FEATURE_IDENTIFY
            ),
        )
        self.assertTrue(info.checked_framing)

    def test_digest_requests(self) -> None:
        """
        Digests of ranges inside the log; a range outside it is refused.
        """
        client, _, connection = self.session()
        d1 = client.digest(0, 1000)
        d2 = client.digest(0, self.master.max_offset + 1)
        connection.flush()
        self.assertEqual(len(self.successResultOf(d1) or b""), 16)
        self.assertIsNone(self.successResultOf(d2))

    def test_cancelled_digest_withdraws(self) -> None:
        """
        A cancelled DIGEST wait removes itself: the session keeps no
        reference to it, its answer is skipped, and the next request still
        gets its own answer (answers come in request order).
        """
        client, _, pump = self.session()
        d1 = client.digest(0, 1000)
        d2 = client.digest(0, 2000)
        d1.cancel()
        self.failureResultOf(d1, CancelledError)
        self.assertNotIn(d1, client._waiting)
        pump.flush()
        self.assertEqual(
            self.successResultOf(d2), range_digest(self.master.commitlog_dir, SEGMENT, 0, 2000)
        )

    def test_kinds_are_enums(self) -> None:
        """
        Divergence kinds are a string enum: C{as_dict} keeps the text
        RocketMQ operators saw in /status.
        """
        found = Divergence(DivergenceKind.AHEAD, 10, 5, None, 5)
        self.assertIs(found.kind, DivergenceKind.AHEAD)
        self.assertEqual(found.as_dict()["kind"], "ahead")

    def test_consistent_prefix(self) -> None:
        """
        A slave holding a prefix of the master's log has not diverged.
        """
        records = list(self.master.records())
        self.copy(records[120].offset)
        self.assertIsNone(self.check())

    def test_ahead(self) -> None:
        """
        A slave with more than the master (which lost its last records):
        ahead, to be cut back to the master's max offset.
        """
        end = self.master.max_offset
        longer = open_store(self, segment_size=SEGMENT)
        position = 0
        while position < end:
            chunk = self.master.read(position, end - position)
            longer.append_at(position, chunk)
            position += len(chunk)
        for _ in range(5):
            longer.put(make_message(b"x" * 100))
        self.copy(longer.max_offset, longer)
        divergence = self.check()
        assert divergence is not None
        self.assertEqual(
            (divergence.kind, divergence.truncate_to, divergence.master_offset),
            ("ahead", end, end),
        )

    def test_different_bytes(self) -> None:
        """
        Same length, different bytes from record 150 on: the first
        different byte and the start of its record, found by stepping back
        several windows and bisecting.
        """
        target = list(self.master.records())[150]
        other = open_store(self, segment_size=SEGMENT)
        for i in range(200):
            # From record 150 on, other bytes (what a master that lost its
            # tail and took new messages at the same offsets holds).
            other.put(make_message(b"m" * (300 + i % 7) if i < 150 else b"M" * (300 + i % 7)))
        self.assertEqual(other.max_offset, self.master.max_offset)
        self.copy(other.max_offset, other)
        divergence = self.check(window=2048)
        assert divergence is not None
        self.assertEqual(divergence.kind, "different")
        self.assertEqual(divergence.truncate_to, target.offset)
        assert divergence.first_difference is not None
        self.assertTrue(target.offset < divergence.first_difference < target.next_offset)
        first = divergence.first_difference
        self.assertEqual(self.master.read(target.offset, first - target.offset),
                         self.slave.read(target.offset, first - target.offset))
        self.assertNotEqual(self.master.read(first, 1), self.slave.read(first, 1))

    def test_behind(self) -> None:
        """
        A slave ending before the master's oldest segment.
        """
        self.copy(list(self.master.records())[10].offset)
        info = MasterInfo(3 * SEGMENT, 3 * SEGMENT + 500, SEGMENT)
        d: Deferred[Divergence | None] = Deferred.fromCoroutine(
            find_divergence(self.slave, _NoClient(), info)  # type: ignore[arg-type]
        )
        divergence = self.successResultOf(d)
        assert divergence is not None
        self.assertEqual((divergence.kind, divergence.truncate_to), ("behind", None))

    def test_classic_master_gives_no_info(self) -> None:
        """
        A peer answering with a classic heartbeat (what a RocketMQ master
        sends to a negative first report) is not an rmqha master.
        """
        client = ControlClient()
        transport = iosim.FakeTransport(client, isServer=False)
        client.makeConnection(transport)
        self.assertEqual(transport.getOutBuffer(), encode_code(CONTROL_PROBE))
        client.dataReceived(encode_code(CONTROL_HELLO) + b"\0\0\0\0" + bytes(16))
        self.failureResultOf(client.info)


class _NoClient:
    def digest(self, start: int, end: int) -> Any:  # pragma: no cover - not reached
        raise AssertionError("no comparison is needed when behind")


class MasterControlTests(SynchronousTestCase):
    def test_bad_request_drops(self) -> None:
        """
        After the hello, anything but a digest request drops the session.
        """
        from twisted.internet.testing import StringTransport

        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message(b"a"))
        factory = MasterFactory(log, Clock())
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.dataReceived(encode_code(CONTROL_HELLO)[:3])
        connection.dataReceived(encode_code(CONTROL_HELLO)[3:] + encode_digest_request(0, 10))
        answer = transport.value()[-CONTROL_DIGEST_SIZE:]
        self.assertEqual(decode_digest_answer(answer)[:2], (0, 10))
        connection.dataReceived(b"\1" * CONTROL_REQUEST_SIZE)
        self.assertTrue(transport.disconnecting)
        connection.connectionLost()
