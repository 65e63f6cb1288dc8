"""
Tests for L{rmqha.ha.master}: the master's side of a slave connection,
against C{StringTransport} (which records producer registration and pause
state) and a C{Clock}.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from typing import Any, Callable

from twisted.internet import tcp
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CONTROL_DIGEST_SIZE,
    CONTROL_HELLO,
    decode_digest_answer,
    encode_code,
    encode_digest_request,
)
from rmqha.ha.control import range_digest
from rmqha.ha.config import HAConfig
from rmqha._sockets import send_file_now, send_now
from rmqha.ha.master import MasterConnection, MasterFactory

from tests._helpers import make_message, open_store, record_sendfile, socket_pair_connection

SEGMENT = 4096


def report(offset: int) -> bytes:
    """
    A slave report, by hand: int64 big-endian.
    """
    return struct.pack(">q", offset)


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """
    Split what the master wrote into (offset, body) frames, by hand.
    """
    result = []
    position = 0
    while position < len(data):
        offset, size = struct.unpack_from(">qi", data, position)
        position += 12
        result.append((offset, data[position : position + size]))
        position += size
    assert position == len(data), "a partial frame was written"
    return result


class MasterTestCase(SynchronousTestCase):
    """
    A master over a small-segment store, and helpers to connect slaves.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = open_store(self, segment_size=SEGMENT)
        # Registered first, so it runs after every connection's cleanup.
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))

    def fill(self, count: int, body: bytes = b"m" * 300) -> None:
        for _ in range(count):
            self.store.put(make_message(body))

    def factory(self, **config: object) -> MasterFactory:
        factory = MasterFactory(self.store, self.clock, HAConfig(**config))  # type: ignore[arg-type]
        self.addCleanup(factory.stopFactory)
        return factory

    def connect(
        self, factory: MasterFactory, port: int = 40000
    ) -> tuple[MasterConnection, StringTransport]:
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(self.disconnect, connection, transport)
        return connection, transport

    def disconnect(self, connection: MasterConnection, transport: StringTransport) -> None:
        if connection in connection.factory.connections:
            connection.connectionLost()

    def store_bytes(self, start: int, end: int) -> bytes:
        out = b""
        while start < end:
            chunk = self.store.read(start, end - start)
            out += chunk
            start += len(chunk)
        return out


class StartTests(MasterTestCase):
    """
    The first report decides where the transfer starts.
    """

    def test_nothing_before_first_report(self) -> None:
        """
        The master sends nothing, not even heartbeats, until the slave's
        first report (as RocketMQ's master does); it registers itself as a
        streaming producer at once.
        """
        self.fill(5)
        factory = self.factory()
        connection, transport = self.connect(factory)
        self.assertIs(transport.producer, connection)
        self.assertTrue(transport.streaming)
        self.clock.advance(30)
        self.assertEqual(transport.value(), b"")

    def test_empty_slave_gets_whole_log(self) -> None:
        """
        Report 0 (an empty slave): by default the whole log from the
        oldest segment (RocketMQ #3661), in frames of at most the batch
        size that never cross a segment boundary.
        """
        self.fill(30)
        end = self.store.max_offset
        self.assertGreater(end, 2 * SEGMENT)
        factory = self.factory(transfer_batch_size=1000)
        connection, transport = self.connect(factory)
        connection.dataReceived(report(0))
        sent = frames(transport.value())
        self.assertEqual(sent[0][0], 0)
        self.assertEqual(b"".join(body for _, body in sent), self.store_bytes(0, end))
        position = 0
        for offset, body in sent:
            self.assertEqual(offset, position)
            self.assertLessEqual(len(body), 1000)
            self.assertEqual(offset // SEGMENT, (offset + len(body) - 1) // SEGMENT)
            position += len(body)
        self.assertEqual(connection.next_offset, end)

    def test_sync_from_last_file(self) -> None:
        """
        With C{sync_from_last_file}, report 0 gets 4.9's rule: only from
        the start of the master's last segment.
        """
        self.fill(30)
        end = self.store.max_offset
        factory = self.factory(sync_from_last_file=True)
        connection, transport = self.connect(factory)
        connection.dataReceived(report(0))
        sent = frames(transport.value())
        self.assertEqual(sent[0][0], end - end % SEGMENT)
        self.assertEqual(sent[-1][0] + len(sent[-1][1]), end)

    def test_resume_from_reported_offset(self) -> None:
        """
        A non-zero first report is where the slave's log ends: transfer
        starts exactly there, and it counts as the slave's ack.
        """
        self.fill(10)
        middle = self.store.put(make_message(b"x")).offset
        self.fill(3)
        factory = self.factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(report(middle))
        sent = frames(transport.value())
        self.assertEqual(sent[0][0], middle)
        self.assertEqual(connection.ack_offset, middle)

    def test_slave_ahead_is_dropped(self) -> None:
        """
        A first report beyond the master's max offset (the slave is ahead:
        the master lost data) drops the connection with a log naming both
        offsets, instead of RocketMQ's endless heartbeats.
        """
        self.fill(2)
        factory = self.factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(report(self.store.max_offset + 1))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")


class AckTests(MasterTestCase):
    """
    Later reports are acknowledgements.
    """

    def test_ack_tracked_and_last_in_read_wins(self) -> None:
        """
        Each report after the first is the slave's ack; of several in one
        read only the last counts (Java's parse rule).
        """
        self.fill(5)
        factory = self.factory()
        connection, _ = self.connect(factory)
        connection.dataReceived(report(0))
        connection.dataReceived(report(100) + report(200) + report(300))
        self.assertEqual(connection.ack_offset, 300)
        status = connection.status()
        self.assertEqual(status.peer, "127.0.0.1:40000")
        self.assertEqual(status.lag_bytes, self.store.max_offset - 300)

    def test_ack_beyond_max_drops(self) -> None:
        """
        An ack beyond the master's max offset (RocketMQ #3015: a fake or
        diverged slave) drops the connection.
        """
        self.fill(2)
        factory = self.factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(report(0))
        bogus = self.store.max_offset + 4096
        with capturedLogs() as events:
            connection.dataReceived(report(bogus))
        self.assertTrue(transport.disconnecting)
        self.assertNotEqual(connection.ack_offset, bogus)
        text = " ".join(formatEvent(e) for e in events)
        self.assertIn(str(bogus), text)
        self.assertIn(str(self.store.max_offset), text)

    def test_negative_report_drops(self) -> None:
        """
        A negative offset is not a report: the connection is dropped.
        """
        factory = self.factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(report(-8))
        self.assertTrue(transport.disconnecting)

    def test_rate(self) -> None:
        """
        bytes_per_s is the ack rate over the recent window, the first
        report (what the slave held at connect) included.
        """
        self.fill(20)
        factory = self.factory()
        connection, _ = self.connect(factory)
        connection.dataReceived(report(0))
        connection.dataReceived(report(1000))
        self.clock.advance(2)
        connection.dataReceived(report(5000))
        # From 0 at connect to 5000 two seconds later.
        self.assertEqual(connection.status().bytes_per_s, 2500.0)


class FlowControlTests(MasterTestCase):
    """
    The connection is a push producer: bounded memory whatever the slave's
    speed.
    """

    def test_pause_and_resume(self) -> None:
        """
        pauseProducing stops writes at the next frame; resumeProducing
        continues exactly where it stopped.
        """
        self.fill(30)
        end = self.store.max_offset
        factory = self.factory(transfer_batch_size=500)
        connection, transport = self.connect(factory)
        connection.pauseProducing()
        connection.dataReceived(report(0))
        self.assertEqual(transport.value(), b"")
        connection.resumeProducing()
        self.assertEqual(
            b"".join(b for _, b in frames(transport.value())), self.store_bytes(0, end)
        )

    def test_paused_from_inside_write(self) -> None:
        """
        A transport that pauses its producer from inside C{write} (as a
        full Twisted transport does) gets no more frames until resumed.
        """
        self.fill(30)
        factory = self.factory(transfer_batch_size=500)
        connection, transport = self.connect(factory)
        original = transport.writeSequence

        def write_then_pause(data):  # type: ignore[no-untyped-def]
            original(data)
            connection.pauseProducing()

        transport.writeSequence = write_then_pause  # type: ignore[method-assign]
        connection.dataReceived(report(0))
        self.assertEqual(len(frames(transport.value())), 1)
        transport.writeSequence = original  # type: ignore[method-assign]
        connection.resumeProducing()
        self.assertEqual(connection.next_offset, self.store.max_offset)

    def test_first_append_of_a_turn_sent_at_once(self) -> None:
        """
        A caught-up connection sends the first append of a reactor turn at
        once; the appends after it in the same turn go together, in one
        frame, on the next turn; the turn after that starts afresh.
        """
        self.fill(2)
        factory = self.factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(report(0))
        transport.clear()
        first = self.store.max_offset
        self.fill(1)
        factory.notify_appended()
        second = self.store.max_offset
        self.assertEqual(frames(transport.value()), [(first, self.store_bytes(first, second))])
        transport.clear()
        self.fill(3)
        factory.notify_appended()
        factory.notify_appended()
        self.assertEqual(transport.value(), b"")
        self.clock.advance(0)
        third = self.store.max_offset
        self.assertEqual(frames(transport.value()), [(second, self.store_bytes(second, third))])
        transport.clear()
        self.clock.advance(0)
        self.assertEqual(transport.value(), b"")
        self.fill(1)
        factory.notify_appended()
        self.assertEqual(
            frames(transport.value()), [(third, self.store_bytes(third, self.store.max_offset))]
        )
        now = self.clock.seconds()
        self.assertIn(now, [call.getTime() for call in self.clock.getDelayedCalls()])

    def test_no_wake_without_connections(self) -> None:
        """
        Appends with no slave connected schedule nothing.
        """
        factory = self.factory()
        self.fill(1)
        factory.notify_appended()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class TimerTests(MasterTestCase):
    """
    Heartbeats and housekeeping, on the injected clock.
    """

    def test_heartbeat_after_idle_interval(self) -> None:
        """
        After C{heartbeat_interval} without a write, an empty frame at the
        next offset; none while frames flow more often than that.
        """
        self.fill(2)
        factory = self.factory(heartbeat_interval=5.0, housekeeping_interval=1000.0)
        connection, transport = self.connect(factory)
        connection.dataReceived(report(0))
        end = self.store.max_offset
        transport.clear()
        self.clock.advance(4.9)
        self.assertEqual(transport.value(), b"")
        self.clock.advance(0.1)
        self.assertEqual(frames(transport.value()), [(end, b"")])
        transport.clear()
        self.clock.advance(3)
        self.fill(1)
        factory.notify_appended()
        self.clock.advance(0)
        transport.clear()
        self.clock.advance(4.9)
        self.assertEqual(transport.value(), b"")
        self.clock.advance(0.1)
        self.assertEqual(frames(transport.value()), [(self.store.max_offset, b"")])

    def test_housekeeping_drops_silent_slave(self) -> None:
        """
        A slave that sends nothing for C{housekeeping_interval} is dropped;
        each report restarts the count.
        """
        factory = self.factory(heartbeat_interval=1000.0, housekeeping_interval=20.0)
        connection, transport = self.connect(factory)
        self.clock.advance(15)
        connection.dataReceived(report(0))
        self.clock.advance(15)
        self.assertFalse(transport.disconnecting)
        self.clock.advance(5)
        self.assertTrue(transport.disconnecting)

    def test_config_refuses_bad_values(self) -> None:
        """
        A batch size above what a RocketMQ slave accepts (4 MiB - 12), or
        non-positive intervals, are refused naming the RocketMQ key.
        """
        for config, key in [
            ({"transfer_batch_size": 4 * 1024 * 1024 - 11}, "haTransferBatchSize"),
            ({"transfer_batch_size": 0}, "haTransferBatchSize"),
            ({"heartbeat_interval": 0}, "haSendHeartbeatInterval"),
            ({"housekeeping_interval": -1}, "haHousekeepingInterval"),
        ]:
            e = self.assertRaises(ValueError, HAConfig, **config)  # type: ignore[arg-type]
            self.assertIn(key, str(e))


class ManySlavesTests(MasterTestCase):
    """
    Any number of slaves, each with its own position and ack.
    """

    def test_independent_slaves(self) -> None:
        """
        Two slaves at different offsets each get their own stream and ack;
        dropping one leaves the other.
        """
        self.fill(10)
        middle = self.store.put(make_message(b"mid")).offset
        self.fill(2)
        factory = self.factory()
        a, ta = self.connect(factory, 40001)
        b, tb = self.connect(factory, 40002)
        a.dataReceived(report(0))
        b.dataReceived(report(middle))
        self.assertEqual(frames(ta.value())[0][0], 0)
        self.assertEqual(frames(tb.value())[0][0], middle)
        self.assertEqual({s.peer for s in factory.slaves()}, {"127.0.0.1:40001", "127.0.0.1:40002"})
        a.connectionLost()
        self.assertEqual([s.peer for s in factory.slaves()], ["127.0.0.1:40002"])

    def test_disconnect_all(self) -> None:
        """
        disconnect_all (the master is stopping) drops every slave.
        """
        factory = self.factory()
        transports = [self.connect(factory, 40001 + i)[1] for i in range(3)]
        factory.disconnect_all("stopping")
        self.assertTrue(all(t.disconnecting for t in transports))


class FakeThreads:
    """
    A C{run_in_thread} that runs nothing until the test says so: the calls
    waiting, each with its Deferred.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def __call__(self, f: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.calls.append((f, d))
        return d

    def run_one(self) -> None:
        f, d = self.calls.pop(0)
        d.callback(f())


def digest_answers(data: bytes) -> list[tuple[int, int]]:
    """
    The (start, end) of each DIGEST answer in C{data}.
    """
    return [
        decode_digest_answer(data[i : i + CONTROL_DIGEST_SIZE])[:2]
        for i in range(0, len(data), CONTROL_DIGEST_SIZE)
    ]


class ControlBoundsTests(MasterTestCase):
    """
    Control sessions cannot make the master do unbounded work or buffer
    unbounded answers (issue 12, items 10 and 12).
    """

    def control(
        self, threads: FakeThreads, rate: float = 1 << 30
    ) -> tuple[MasterConnection, StringTransport]:
        self.fill(40)
        factory = MasterFactory(
            self.store, self.clock, HAConfig(), run_in_thread=threads, digest_rate=rate
        )
        self.addCleanup(factory.stopFactory)
        connection, transport = self.connect(factory)
        self.addCleanup(connection.connectionLost)
        connection.dataReceived(encode_code(CONTROL_HELLO))
        transport.clear()
        return connection, transport

    def test_one_digest_in_flight(self) -> None:
        """
        1000 pipelined DIGEST requests: one is hashed at a time, off the
        reactor thread, and reading stops meanwhile; the answers come in
        order, each the digest of its range.
        """
        threads = FakeThreads()
        connection, transport = self.control(threads)
        ranges = [(i, i + 1000 + i) for i in range(1000)]
        connection.dataReceived(b"".join(encode_digest_request(*r) for r in ranges))
        self.assertEqual(len(threads.calls), 1)
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(transport.value(), b"")
        for done in range(1, 1001):
            threads.run_one()
            self.assertEqual(len(threads.calls), 1 if done < 1000 else 0)
        self.assertEqual(transport.producerState, "producing")
        answers = transport.value()
        self.assertEqual(digest_answers(answers), ranges)
        expected = hashlib.blake2b(self.store_bytes(999, 2998), digest_size=16).digest()
        self.assertEqual(decode_digest_answer(answers[-CONTROL_DIGEST_SIZE:])[2], expected)

    def test_budget_paces_digests(self) -> None:
        """
        Bytes hashed per second per peer are bounded: past the burst, the
        next request waits on the clock before it is hashed.
        """
        threads = FakeThreads()
        connection, transport = self.control(threads, rate=4000)
        connection.dataReceived(encode_digest_request(0, 4000) + encode_digest_request(0, 4000))
        threads.run_one()
        self.assertEqual(threads.calls, [])
        self.clock.advance(0.9)
        self.assertEqual(threads.calls, [])
        self.clock.advance(0.1)
        threads.run_one()
        self.assertEqual(digest_answers(transport.value()), [(0, 4000), (0, 4000)])

    def test_refusals_answered_in_order(self) -> None:
        """
        Ranges outside the log are refused without a thread, in order with
        the digests before and after them.
        """
        threads = FakeThreads()
        connection, transport = self.control(threads)
        end = self.store.max_offset
        connection.dataReceived(
            encode_digest_request(0, 10)
            + encode_digest_request(0, end + 1)
            + encode_digest_request(5, 4)
            + encode_digest_request(10, 20)
        )
        threads.run_one()
        threads.run_one()
        self.assertEqual(digest_answers(transport.value()), [(0, 10), (-1, -1), (-1, -1), (10, 20)])

    def test_stops_reading_when_answers_are_not_read(self) -> None:
        """
        A peer that does not read its answers fills the transport, which
        pauses the session: it answers nothing more and stops reading until
        resumed; bytes it holds stay bounded, and a peer pushing past the
        bound is dropped.
        """
        threads = FakeThreads()
        connection, transport = self.control(threads)
        end = self.store.max_offset
        refused = encode_digest_request(0, end + 1)
        self.assertIs(transport.producer, connection)
        connection.pauseProducing()
        self.assertEqual(transport.producerState, "paused")
        connection.dataReceived(refused * 100)
        self.assertEqual(transport.value(), b"")
        connection.resumeProducing()
        self.assertEqual(transport.producerState, "producing")
        self.assertEqual(len(digest_answers(transport.value())), 100)
        connection.pauseProducing()
        with capturedLogs() as events:
            connection.dataReceived(refused * (256 * 1024 // len(refused) + 1))
        self.assertTrue(transport.disconnecting)
        self.assertIn("does not wait for answers", formatEvent(events[-1]))

    def test_hash_files_gone(self) -> None:
        """
        Hashing in a thread reads the segment files with its own
        descriptors; a file gone meanwhile gives no digest (refused), not
        an exception.
        """
        self.fill(5)
        directory = self.store.commitlog_dir
        self.assertIsNotNone(range_digest(directory, SEGMENT, 0, 100))
        self.assertIsNone(range_digest(directory + "-gone", SEGMENT, 0, 100))


class SendNowTests(SynchronousTestCase):
    """
    L{send_now}: frames and reports leave at once on a plain TCP connection
    with nothing queued, and otherwise queue behind what is, in order.
    (A connected socket pair, no reactor: nothing runs a turn.)
    """

    def connection(self) -> tuple[tcp.Connection, socket.socket]:
        return socket_pair_connection(self, Protocol())

    def test_sent_at_once(self) -> None:
        """
        With nothing queued, the chunks are on the socket when C{send_now}
        returns, in order, and nothing waits for a write turn.
        """
        transport, peer = self.connection()
        self.assertTrue(send_now(transport, [b"header", b"body"]))
        self.assertEqual(peer.recv(100), b"headerbody")
        self.assertEqual((transport.dataBuffer, transport._tempDataLen), (b"", 0))
        self.assertNotIn(transport, transport.reactor.getWriters())

    def test_queued_behind_queued_bytes(self) -> None:
        """
        With bytes already queued, the chunks queue behind them (nothing
        overtakes), and the reactor's write turn sends both in order.
        """
        transport, peer = self.connection()
        transport.write(b"first")
        self.assertFalse(send_now(transport, [b"second", b"third"]))
        with self.assertRaises(BlockingIOError):
            peer.recv(100)
        transport.doWrite()
        self.assertEqual(peer.recv(100), b"firstsecondthird")

    def test_rest_queued_when_the_socket_is_full(self) -> None:
        """
        What a full socket does not take is queued (and the writer
        registered), then sent by the write turns, with nothing lost.
        """
        transport, peer = self.connection()
        chunk = b"x" * 65536
        sent = 0
        with self.assertRaises(BlockingIOError):
            while True:
                sent += transport.socket.send(chunk)
        self.assertFalse(send_now(transport, [b"A" * 1000, b"B" * 1000]))
        self.assertEqual(transport._tempDataLen, 2000)
        self.assertIn(transport, transport.reactor.getWriters())
        received = bytearray()
        while len(received) < sent + 2000:
            try:
                received += peer.recv(1 << 20)
            except BlockingIOError:
                transport.doWrite()
        self.assertEqual(bytes(received[sent:]), b"A" * 1000 + b"B" * 1000)

    def test_other_transports_write_sequence(self) -> None:
        """
        Any other transport (TLS, C{StringTransport}) gets C{writeSequence}.
        """
        transport = StringTransport()
        self.assertFalse(send_now(transport, [b"a", b"b"]))
        self.assertEqual(transport.value(), b"ab")

    def test_forwarding_wrapper_looked_through(self) -> None:
        """
        Under a wrapper that only forwards writes (the connection limit's
        L{ProtocolWrapper}, around every accepted HA connection), the
        chunks still leave at once; a wrapper that transforms writes (as
        TLS does) is given them instead.
        """
        transport, peer = self.connection()
        wrapper = ProtocolWrapper(WrappingFactory(Factory()), Protocol())
        wrapper.makeConnection(transport)
        self.assertTrue(send_now(wrapper, [b"to", b"day"]))
        self.assertEqual(peer.recv(100), b"today")

        class Transforming(ProtocolWrapper):
            def writeSequence(self, data: Any) -> None:
                self.seen = list(data)

        transforming = Transforming(WrappingFactory(Factory()), Protocol())
        transforming.makeConnection(transport)
        self.assertFalse(send_now(transforming, [b"secret"]))
        self.assertEqual(transforming.seen, [b"secret"])
        with self.assertRaises(BlockingIOError):
            peer.recv(100)


class SendFileNowTests(SendNowTests):
    """
    L{send_file_now}: a frame's header, then its body from the file with
    C{sendfile}, at once on a plain TCP connection with nothing queued;
    what the socket does not take, and everything on other transports,
    goes the ordinary way, read from the file (C{rest}), in order.
    """

    def reader(self, body: bytes) -> tuple[Callable[[int], bytes], list[int]]:
        """
        A C{rest} for C{body}: the body from a byte on, and the starts it
        was asked for.
        """
        asked: list[int] = []

        def rest(start: int) -> bytes:
            asked.append(start)
            return body[start:]

        return rest, asked

    def file(self, body: bytes, at: int = 100) -> int:
        """
        A file holding C{body} from position C{at} (and other bytes
        around it, which must not be sent); its descriptor.
        """
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"-" * at + body + b"+" * 100)
        fd = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        return fd

    def test_body_from_the_file(self) -> None:
        """
        With nothing queued, header and body are on the socket when it
        returns, the body sent from the file at its position.
        """
        transport, peer = self.connection()
        calls = record_sendfile(self)
        body = b"record" * 1000
        fd = self.file(body)
        rest, asked = self.reader(body)
        self.assertTrue(send_file_now(transport, b"HEADER", fd, 100, len(body), rest))
        self.assertEqual(asked, [])
        received = b""
        while len(received) < 6 + len(body):
            received += peer.recv(1 << 20)
        self.assertEqual(received, b"HEADER" + body)
        self.assertEqual(calls, [(fd, 100, len(body))])
        self.assertEqual((transport.dataBuffer, transport._tempDataLen), (b"", 0))

    def test_rest_of_the_body_queued(self) -> None:
        """
        A socket with less room than the body takes part of it from the
        file; the rest is queued from the bytes in hand (and the writer
        registered), and arrives after it, in order.
        """
        transport, peer = self.connection()
        calls = record_sendfile(self)
        sent = 0
        with self.assertRaises(BlockingIOError):
            while True:
                sent += transport.socket.send(b"x" * 65536)
        # (Room for part of the body: whole 64 KiB sends read back, as a
        # socket frees what its peer has read whole.)
        drained = 0
        while drained < 131072:
            drained += len(peer.recv(131072 - drained))
        body = os.urandom(256 * 1024)
        fd = self.file(body)
        rest, asked = self.reader(body)
        self.assertFalse(send_file_now(transport, b"HEADER", fd, 100, len(body), rest))
        self.assertEqual(len(calls), 1)
        self.assertEqual(len(asked), 1)
        self.assertGreater(asked[0], 0)
        self.assertGreater(transport._tempDataLen, 0)
        self.assertIn(transport, transport.reactor.getWriters())
        received = bytearray()
        while len(received) < sent - drained + 6 + len(body):
            try:
                received += peer.recv(1 << 20)
            except BlockingIOError:
                transport.doWrite()
        self.assertEqual(bytes(received[sent - drained :]), b"HEADER" + body)

    def test_full_socket_queues_header_and_body(self) -> None:
        """
        A full socket takes nothing: the header and the body (read whole)
        are queued behind, and no C{sendfile} is tried.
        """
        transport, peer = self.connection()
        calls = record_sendfile(self)
        with self.assertRaises(BlockingIOError):
            while True:
                transport.socket.send(b"x" * 65536)
        rest, asked = self.reader(b"body")
        self.assertFalse(send_file_now(transport, b"HEADER", self.file(b"body"), 100, 4, rest))
        self.assertEqual(calls, [])
        self.assertEqual(asked, [0])
        self.assertEqual(transport._tempDataLen, 10)

    def test_unreadable_file_sends_the_bytes_in_hand(self) -> None:
        """
        A descriptor C{sendfile} cannot read (here: not a file) costs
        nothing: the body is read the other way (C{rest}), queued, and
        arrives after the header.
        """
        transport, peer = self.connection()
        directory = os.open(self.mktemp().rsplit("/", 1)[0] or ".", os.O_RDONLY)
        self.addCleanup(os.close, directory)
        rest, asked = self.reader(b"body")
        self.assertFalse(send_file_now(transport, b"HEADER", directory, 0, 4, rest))
        self.assertEqual(asked, [0])
        transport.doWrite()
        self.assertEqual(peer.recv(100), b"HEADERbody")

    def test_other_transports_get_the_bytes(self) -> None:
        """
        TLS, C{StringTransport} and the like: C{writeSequence} of the
        header and the body read whole; no C{sendfile}.
        """
        calls = record_sendfile(self)
        transport = StringTransport()
        rest, asked = self.reader(b"body")
        self.assertFalse(send_file_now(transport, b"HEADER", self.file(b"body"), 100, 4, rest))
        self.assertEqual(transport.value(), b"HEADERbody")
        self.assertEqual(asked, [0])
        self.assertEqual(calls, [])
