"""
Tests for checked framing (CRC-32 on every frame and report between two
rmqha peers), the CRCs of control messages, and how a slave retries a
check of its master that could not finish (docs/protocol.md).
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from typing import Any, Callable

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.internet.protocol import Protocol
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CHECKED_ACK,
    CHECKED_HEADER_SIZE,
    CHECKED_HELLO,
    CONTROL_HELLO,
    CONTROL_PROBE,
    CONTROL_REFUSED,
    FEATURE_CHECKED_FRAMING,
    HEADER_SIZE,
    ChecksumError,
    MasterClosing,
    NotControlError,
    ProtocolError,
    ReportDecoder,
    TransferDecoder,
    decode_control_info,
    decode_digest_answer,
    decode_digest_request,
    encode_checked_header,
    encode_code,
    encode_control_info,
    encode_digest_answer,
    encode_digest_request,
    encode_report,
)
from rmqha import _sockets
from rmqha._sockets import send_file_now
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import SegmentReadError
from rmqha.ha.control import CheckFailed, ControlClient, probe
from rmqha.ha import master
from rmqha.ha.config import HAConfig
from rmqha.ha.master import MasterConnection, MasterFactory
from rmqha.ha.slave import SlaveConnection, SlaveFactory
from rmqha.testing import StringEndpoint, connect_in_memory

from tests._helpers import (
    disk,
    fixed_clock,
    make_message,
    open_store,
    record_sendfile,
    replica_of,
    replication_of,
    segment_files,
    segment_path,
    socket_pair_connection,
)

SEGMENT = 4096


def checked_frame(offset: int, body: bytes = b"") -> bytes:
    """
    A checked frame, by hand: offset, size, CRC of the body, CRC of those
    16 bytes, body.
    """
    head = struct.pack(">qiI", offset, len(body), zlib.crc32(body))
    return head + struct.pack(">I", zlib.crc32(head)) + body


def checked_report(offset: int) -> bytes:
    value = struct.pack(">q", offset)
    return value + struct.pack(">I", zlib.crc32(value))


def flipped(data: bytes, bit: int) -> bytes:
    """
    C{data} with bit number C{bit} (0 = the first byte's top bit) inverted.
    """
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


def code(value: int) -> bytes:
    return struct.pack(">q", value)


class ReportTests(SynchronousTestCase):
    """
    Checked reports: 8-byte offset, CRC-32 of those 8 bytes.
    """

    def test_encoding(self) -> None:
        """
        A checked report is the classic one plus its CRC.
        """
        self.assertEqual(encode_report(123456, checked=True), checked_report(123456))
        self.assertEqual(encode_report(123456), struct.pack(">q", 123456))

    def test_decoding(self) -> None:
        """
        Cut anywhere, the last whole report of a read counts, as classic.
        """
        decoder = ReportDecoder(checked=True)
        stream = checked_report(5) + checked_report(70)
        self.assertIsNone(decoder.feed(stream[:7]))
        self.assertEqual(decoder.feed(stream[7:15]), 5)
        self.assertEqual(decoder.feed(stream[15:]), 70)
        self.assertEqual(decoder.count, 2)

    def test_every_flip_is_caught(self) -> None:
        """
        Any single flipped bit of a report fails its checksum, naming the
        damaged offset as it arrived.
        """
        report = checked_report(4096)
        for bit in range(len(report) * 8):
            with self.assertRaises(ChecksumError, msg=f"bit {bit}") as caught:
                ReportDecoder(checked=True).feed(flipped(report, bit))
            self.assertIn("fails its checksum", str(caught.exception))

    def test_skipped_report_is_checked(self) -> None:
        """
        Reports of one read before the last one are skipped for the offset
        but still checked: a damaged one is not passed over.
        """
        data = flipped(checked_report(10), 60) + checked_report(20)
        self.assertRaises(ChecksumError, ReportDecoder(checked=True).feed, data)


class FrameTests(SynchronousTestCase):
    """
    Checked frames: the master's CHECKED_ACK, then 20-byte headers.
    """

    def stream(self) -> tuple[bytes, list[tuple[int, bytes]]]:
        frames = [(0, bytes(range(200))), (200, b""), (200, b"x" * 77)]
        data = code(CHECKED_ACK) + b"".join(checked_frame(o, b) for o, b in frames)
        return data, frames

    def decode(self, data: bytes, cuts: int = 1) -> list[tuple[int, bytes]]:
        decoder = TransferDecoder(checked=True)
        out: list[tuple[int, bytes]] = []
        step = max(1, len(data) // cuts)
        for i in range(0, len(data), step):
            decoder.feed(data[i : i + step])
            while (frame := decoder.next_frame()) is not None:
                out.append((frame.offset, bytes(frame.body)))
        return out

    def test_encoding(self) -> None:
        """
        L{encode_checked_header} builds the documented header.
        """
        body = b"commit log bytes"
        self.assertEqual(encode_checked_header(99, body) + body, checked_frame(99, body))
        self.assertEqual(len(encode_checked_header(0, b"")), CHECKED_HEADER_SIZE)

    def test_round_trip(self) -> None:
        """
        Whole, or cut into small pieces, the frames come out as sent.
        """
        data, frames = self.stream()
        for cuts in (1, 3, 50, len(data)):
            self.assertEqual(self.decode(data, cuts), frames, f"{cuts} pieces")

    def test_every_flip_is_caught(self) -> None:
        """
        Whatever single bit is flipped (the confirmation, a header, a body),
        decoding fails before a damaged frame is returned; the frames
        before the damage come out intact.
        """
        data, frames = self.stream()
        for bit in range(len(data) * 8):
            decoder = TransferDecoder(checked=True)
            out: list[tuple[int, bytes]] = []
            with self.assertRaises(ProtocolError, msg=f"bit {bit}"):
                decoder.feed(flipped(data, bit))
                while (frame := decoder.next_frame()) is not None:
                    out.append((frame.offset, bytes(frame.body)))
            self.assertEqual(out, frames[: len(out)], f"bit {bit}")

    def test_damaged_header_caught_before_its_body(self) -> None:
        """
        A header is checked as soon as it is here: a damaged size does not
        make the slave wait for megabytes that will never come.
        """
        decoder = TransferDecoder(checked=True)
        header = checked_frame(0, b"y" * 10)[:CHECKED_HEADER_SIZE]
        decoder.feed(code(CHECKED_ACK) + flipped(header, 8 * 8 + 9))
        with self.assertRaises(ChecksumError) as caught:
            decoder.pending_header()
        self.assertIn("a frame header fails its checksum", str(caught.exception))

    def test_damaged_body_names_the_frame(self) -> None:
        """
        A damaged body is named by its offset and size.
        """
        decoder = TransferDecoder(checked=True)
        decoder.feed(code(CHECKED_ACK) + flipped(checked_frame(4096, b"z" * 50), 200))
        with self.assertRaises(ChecksumError) as caught:
            decoder.next_frame()
        self.assertIn("the frame of 50 bytes at offset 4096", str(caught.exception))

    def test_classic_master_not_confirming(self) -> None:
        """
        A master that answers with a classic frame did not take up checked
        framing: a clear error, not a misparse.
        """
        decoder = TransferDecoder(checked=True)
        with self.assertRaises(ProtocolError) as caught:
            decoder.feed(struct.pack(">qi", 0, 0))
        self.assertIn("did not confirm checked framing", str(caught.exception))
        self.assertFalse(decoder.confirmed)


class ControlMessageTests(SynchronousTestCase):
    """
    Control messages after the hello end with a CRC-32.
    """

    def test_round_trips(self) -> None:
        """
        INFO, DIGEST requests and answers decode to what was encoded.
        """
        self.assertEqual(
            decode_control_info(encode_control_info(10, 20, 4096, FEATURE_CHECKED_FRAMING)),
            (10, 20, 4096, FEATURE_CHECKED_FRAMING),
        )
        self.assertEqual(decode_digest_request(encode_digest_request(0, 100)), (0, 100))
        digest = bytes(range(16))
        self.assertEqual(
            decode_digest_answer(encode_digest_answer(0, 100, digest)), (0, 100, digest)
        )

    def test_every_flip_is_caught(self) -> None:
        """
        Any flipped bit of INFO, a request or an answer is an error (never
        a different valid message); past the code it is a checksum error.
        """
        cases: list[tuple[bytes, Callable[[bytes], object]]] = [
            (encode_control_info(10, 20, 4096, 1), decode_control_info),
            (encode_digest_request(0, 100), decode_digest_request),
            (encode_digest_answer(0, 100, bytes(16)), decode_digest_answer),
        ]
        for message, decode in cases:
            for bit in range(len(message) * 8):
                with self.assertRaises(ProtocolError, msg=f"bit {bit}") as caught:
                    decode(flipped(message, bit))
                if bit >= 64:
                    self.assertIsInstance(caught.exception, ChecksumError)

    def test_not_info(self) -> None:
        """
        Something other than INFO is a classic master's answer.
        """
        self.assertRaises(NotControlError, decode_control_info, struct.pack(">qi", -5, 0) + bytes(24))


class MasterTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.store = open_store(self, segment_size=SEGMENT)
        for _ in range(6):
            self.store.put(make_message(b"m" * 300))
        self.factory = MasterFactory(self.store, self.clock)
        self.addCleanup(self.factory.stopFactory)

    def connect(self) -> tuple[MasterConnection, StringTransport]:
        connection = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(connection.connectionLost)
        return connection, transport


class MasterTests(MasterTestCase):
    """
    The master's side of checked framing.
    """

    def test_hello_confirmed_then_checked_frames(self) -> None:
        """
        CHECKED_HELLO and a checked report: the master confirms, then sends
        checked frames from the reported offset; its status says so.
        """
        connection, transport = self.connect()
        connection.dataReceived(code(CHECKED_HELLO)[:5])
        connection.dataReceived(code(CHECKED_HELLO)[5:] + checked_report(0))
        data = transport.value()
        self.assertEqual(data[:8], code(CHECKED_ACK))
        decoder = TransferDecoder(checked=True)
        decoder.feed(data)
        received = b""
        while (frame := decoder.next_frame()) is not None:
            self.assertEqual(frame.offset, len(received))
            received += frame.body
        self.assertEqual(received, self.store.read(0, self.store.max_offset))
        (status,) = self.factory.slaves()
        self.assertEqual(status.framing, "checked")

    def test_catch_up_frames(self) -> None:
        """
        A slave on checked framing (an rmqha slave) that is behind by at
        least L{CATCH_UP_BATCH_SIZE} gets frames of that size (fewer frames
        for the master to read, seal and send), never across a segment;
        the tail closer than that comes in C{haTransferBatchSize} frames.
        A classic slave (RocketMQ's) gets C{haTransferBatchSize} frames
        only.
        """
        self.patch(master, "CATCH_UP_BATCH_SIZE", 1500)
        for _ in range(20):
            self.store.put(make_message(b"m" * 300))
        end = self.store.max_offset
        self.assertGreater(end, 2 * SEGMENT)
        factory = MasterFactory(self.store, self.clock, HAConfig(transfer_batch_size=500))
        self.addCleanup(factory.stopFactory)
        self.factory = factory
        connection, transport = self.connect()
        connection.dataReceived(code(CHECKED_HELLO) + checked_report(0))
        decoder = TransferDecoder(checked=True)
        decoder.feed(transport.value())
        sizes = []
        position = 0
        while (frame := decoder.next_frame()) is not None:
            self.assertEqual(frame.offset, position)
            size = len(frame.body)
            # (A frame ends at its segment's end at the latest.)
            segment_left = SEGMENT - position % SEGMENT
            if end - position >= 1500:
                self.assertEqual(size, min(1500, segment_left))
            else:
                self.assertEqual(size, min(500, segment_left, end - position))
            sizes.append(size)
            position += size
        self.assertEqual(position, end)
        self.assertIn(1500, sizes)

        classic, transport = self.connect()
        classic.dataReceived(struct.pack(">q", 0))
        data = transport.value()
        position = 0
        while position < len(data):
            size = struct.unpack_from(">qi", data, position)[1]
            self.assertLessEqual(size, 500)
            position += HEADER_SIZE + size

    def test_catch_up_bodies_from_the_file(self) -> None:
        """
        On a plain TCP connection, catch-up frames' bodies go from the
        segment files with C{sendfile} (each call at the position of the
        frame's offset in its segment) and reach the slave as the store
        holds them, each frame checked; the tail frames, smaller, are
        sent as before.
        """
        self.patch(master, "CATCH_UP_BATCH_SIZE", 1500)
        # (Two frames a turn: the answer to the hello is queued on the
        # first one, so the frames with it queue behind.)
        self.patch(master, "_DIRECT_BUDGET", 3000)
        for _ in range(20):
            self.store.put(make_message(b"m" * 300))
        end = self.store.max_offset
        real = _sockets._sendfile
        # (Each call as its log offset, size, bytes and whether the socket
        # took them whole, found when it is made: descriptors are reused.)
        calls: list[tuple[int, int, bytes, bool]] = []

        def recording(out: int, fd: int, position: int, count: int) -> int:
            sent = real(out, fd, position, count)
            data = os.pread(fd, count, position)
            calls.append((self.offset_of(fd, position), count, data, sent == count))
            return sent

        self.patch(_sockets, "_sendfile", recording)
        reads: list[int] = []
        read = self.store.read

        def recorded(offset: int, limit: int) -> bytes:
            reads.append(offset)
            return read(offset, limit)

        self.patch(self.store, "read", recorded)
        _, transport, peer = self.connect_over_sockets()
        decoder = TransferDecoder(checked=True)
        received = b""
        while len(received) < end:
            transport.doWrite()
            self.clock.advance(0)
            try:
                decoder.feed(peer.recv(1 << 20))
            except BlockingIOError:
                pass
            while (frame := decoder.next_frame()) is not None:
                if frame.body:
                    self.assertEqual(frame.offset, len(received))
                    received += frame.body
        self.assertEqual(received, disk(self.store, 0, end))
        self.assertTrue(calls)
        for start, count, data, whole in calls:
            self.assertEqual(data, disk(self.store, start, start + count))
            self.assertEqual(count, min(1500, SEGMENT - start % SEGMENT))
            if whole:
                # (Its CRC computed in a mapping: never read into the
                # process.)
                self.assertNotIn(start, reads)
        self.assertTrue(any(whole for _, _, _, whole in calls))

    def catch_up_over_sockets(self) -> tuple[MasterConnection, Any, Any]:
        """
        A checked connection on a socket pair catching up from offset 0,
        catch-up frames of 1,500 bytes (C{sendfile} from the second turn
        on); its transport and the slave's end.
        """
        self.patch(master, "CATCH_UP_BATCH_SIZE", 1500)
        self.patch(master, "_DIRECT_BUDGET", 3000)
        for _ in range(30):
            self.store.put(make_message(b"m" * 300))
        self.store.flush()
        return self.connect_over_sockets()

    def connect_over_sockets(self) -> tuple[MasterConnection, Any, Any]:
        """
        A master connection (transfer batches of 500 bytes) on a socket
        pair, its slave's checked hello and report of offset 0 received;
        the connection, its transport and the slave's end.
        """
        factory = MasterFactory(self.store, self.clock, HAConfig(transfer_batch_size=500))
        self.addCleanup(factory.stopFactory)
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport, peer = socket_pair_connection(self, connection)
        connection.makeConnection(transport)
        self.addCleanup(connection.connectionLost)
        connection.dataReceived(code(CHECKED_HELLO) + checked_report(0))
        return connection, transport, peer

    def drain(self, transport: Any, peer: Any) -> bytes:
        """
        Run the master's turns and read what it sends until it closes.
        """
        received = b""
        for _ in range(50):
            if not transport.disconnected:
                transport.doWrite()
            self.clock.advance(0)
            transport.reactor.advance(0)  # (an abort's connectionLost)
            try:
                received += peer.recv(1 << 20)
            except BlockingIOError:
                pass
        return received

    def test_unreadable_segment_refused_from_the_file(self) -> None:
        """
        A catch-up whose next segment file is gone, on the path that sends
        bodies from the file: the slave is told the line naming the file
        (CLOSING), and the master's log is not damaged.
        """
        connection, transport, peer = self.catch_up_over_sockets()
        calls = record_sendfile(self)
        path = segment_path(self.store.store_dir, SEGMENT)
        os.unlink(path)
        with capturedLogs() as events:
            received = self.drain(transport, peer)
        self.assertTrue(calls)
        decoder = TransferDecoder(checked=True)
        decoder.feed(received)
        with self.assertRaises(MasterClosing) as caught:
            while decoder.next_frame() is not None:
                pass
        self.assertIn(f"segment file {path}: was removed", caught.exception.reason)
        lines = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(lines), 1, lines)
        self.assertIsNone(self.store.damage)

    def test_unreadable_rest_drops_the_connection(self) -> None:
        """
        The socket took part of a body sent from the file, and the rest
        cannot be read: part of the frame is out, so no last words can
        follow; the connection is dropped with one line naming the
        error; the frame cut short never becomes one the slave accepts.
        """
        connection, transport, peer = self.catch_up_over_sockets()
        real = _sockets._sendfile
        self.patch(_sockets, "_sendfile", lambda out, fd, at, count: real(out, fd, at, count // 2))

        def unreadable(offset: int, limit: int) -> bytes:
            raise SegmentReadError("/the/segment", "cannot read 750 bytes at position 2250")

        with capturedLogs() as events:
            transport.doWrite()
            self.patch(self.store, "read", unreadable)
            received = self.drain(transport, peer)
        self.assertTrue(transport.disconnected)
        lines = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("segment file /the/segment: cannot read 750 bytes", lines[0])
        decoder = TransferDecoder(checked=True)
        decoder.feed(received)
        while (frame := decoder.next_frame()) is not None:
            self.assertEqual(
                frame.body, disk(self.store, frame.offset, frame.offset + len(frame.body))
            )
        # (The frame cut short: never whole, so never appended.)
        self.assertGreater(decoder.buffered, 0)

    def test_file_changed_after_the_read_is_refused(self) -> None:
        """
        A body sent from the file after the file's bytes changed under it
        (the header's CRC is of the bytes read) reaches the slave as a
        checksum failure, never as a frame it accepts.
        """
        body = b"m" * 1000
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(body)
        fd = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        header = encode_checked_header(0, body)
        os.pwrite(fd, b"X", 500)
        calls = record_sendfile(self)
        transport, peer = socket_pair_connection(self, Protocol())
        self.assertTrue(send_file_now(transport, header, fd, 0, len(body), lambda start: body[start:]))
        self.assertEqual(calls, [(fd, 0, len(body))])
        decoder = TransferDecoder(checked=True)
        # (What a master says first on checked framing, then the frame.)
        decoder.feed(code(CHECKED_ACK) + peer.recv(1 << 20))
        self.assertRaises(ChecksumError, decoder.next_frame)

    def offset_of(self, fd: int, position: int) -> int:
        """
        The log offset of C{position} in the segment file open as C{fd}
        (its name is its start offset).
        """
        return int(os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))) + position

    def test_catch_up_yields_the_reactor(self) -> None:
        """
        Catch-up frames go out C{_DIRECT_BUDGET} body bytes per reactor
        turn: the frames after that on a later turn (not queued behind them
        through Twisted's buffer), in order, to the end; a connection lost
        in between leaves nothing scheduled.
        """
        self.patch(master, "CATCH_UP_BATCH_SIZE", 1000)
        self.patch(master, "_DIRECT_BUDGET", 2000)
        for _ in range(20):
            self.store.put(make_message(b"m" * 300))
        end = self.store.max_offset
        factory = MasterFactory(self.store, self.clock, HAConfig(transfer_batch_size=500))
        self.addCleanup(factory.stopFactory)
        self.factory = factory
        connection, transport = self.connect()

        def now() -> list[object]:
            return [c for c in self.clock.getDelayedCalls() if c.getTime() <= self.clock.seconds()]

        def frames() -> list[tuple[int, int]]:
            decoder.feed(transport.value())
            transport.clear()
            out = []
            while (frame := decoder.next_frame()) is not None:
                out.append((frame.offset, len(frame.body)))
            return out

        decoder = TransferDecoder(checked=True)
        connection.dataReceived(code(CHECKED_HELLO) + checked_report(0))
        first = frames()
        self.assertEqual(sum(size for _, size in first), 2000)
        self.assertEqual(len(now()), 1)
        self.clock.advance(0)
        rest = frames()
        position = 0
        for offset, size in first + rest:
            self.assertEqual(offset, position)
            position += size
        self.assertEqual(position, end)
        self.assertEqual(now(), [])

        again = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        transport = StringTransport()
        again.makeConnection(transport)
        decoder = TransferDecoder(checked=True)
        again.dataReceived(code(CHECKED_HELLO) + checked_report(0))
        self.assertEqual(sum(size for _, size in frames()), 2000)
        self.assertEqual(len(now()), 1)
        again.connectionLost()
        self.assertEqual(now(), [])

    def test_heartbeat_is_checked(self) -> None:
        """
        Heartbeats are checked frames too.
        """
        connection, transport = self.connect()
        connection.dataReceived(code(CHECKED_HELLO) + checked_report(self.store.max_offset))
        transport.clear()
        self.clock.advance(self.factory.config.heartbeat_interval)
        self.assertEqual(transport.value(), checked_frame(self.store.max_offset))

    def test_damaged_report_dropped_not_counted(self) -> None:
        """
        A report that fails its CRC drops the slave and is never an ack.
        """
        connection, transport = self.connect()
        connection.dataReceived(code(CHECKED_HELLO) + checked_report(0))
        with capturedLogs() as events:
            connection.dataReceived(flipped(checked_report(self.store.max_offset), 40))
        self.assertEqual(connection.ack_offset, 0)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.factory.checksum_failures, 1)
        self.assertIn("fails its checksum", "".join(formatEvent(e) for e in events))

    def test_unknown_negative_code_refused(self) -> None:
        """
        A negative first value that is no known code is answered with
        CONTROL_REFUSED (so an rmqha slave retries instead of taking us
        for RocketMQ), and the connection closed after it is sent.
        """
        connection, transport = self.connect()
        connection.dataReceived(flipped(encode_code(CONTROL_HELLO), 63))
        self.assertEqual(transport.value(), code(CONTROL_REFUSED))
        self.assertTrue(transport.disconnecting)

    def test_classic_slave_unchanged(self) -> None:
        """
        A classic first report gets classic 12-byte headers.
        """
        connection, transport = self.connect()
        connection.dataReceived(struct.pack(">q", 0))
        offset, size = struct.unpack_from(">qi", transport.value())
        self.assertEqual((offset, size), (0, self.store.max_offset))
        self.assertEqual(self.factory.slaves()[0].framing, "classic")

    def test_damaged_control_request(self) -> None:
        """
        A control request that fails its CRC ends the session.
        """
        connection, transport = self.connect()
        connection.dataReceived(encode_code(CONTROL_HELLO))
        connection.dataReceived(flipped(encode_digest_request(0, 100), 100))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.factory.checksum_failures, 1)


class SlaveTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.source = open_store(self, segment_size=SEGMENT)
        self.replica = open_store(self, segment_size=SEGMENT)
        for _ in range(6):
            self.source.put(make_message(b"s" * 300))
        self.suspects = 0

    def suspect(self) -> None:
        self.suspects += 1

    def connect(self, checked: bool = True) -> tuple[SlaveConnection, StringTransport]:
        factory = SlaveFactory(self.replica, self.clock, on_suspect=self.suspect)
        factory.checked = checked
        connection = factory.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(connection.connectionLost)
        connection.send_report()
        return connection, transport


class SlaveTests(SlaveTestCase):
    """
    The slave's side of checked framing.
    """

    def test_hello_then_checked_reports(self) -> None:
        """
        The first write is CHECKED_HELLO and a checked report; later
        reports are checked, with no second hello.
        """
        connection, transport = self.connect()
        self.assertEqual(transport.value(), code(CHECKED_HELLO) + checked_report(0))
        transport.clear()
        end = self.source.max_offset
        connection.dataReceived(code(CHECKED_ACK) + checked_frame(0, self.source.read(0, end)))
        self.assertEqual(self.replica.max_offset, end)
        self.assertEqual(transport.value(), checked_report(end))

    def test_damaged_frame_not_written(self) -> None:
        """
        A frame whose bytes were damaged on the way is not appended, not
        acknowledged; the connection is dropped and the failure counted.
        """
        connection, transport = self.connect()
        transport.clear()
        end = self.source.max_offset
        damaged = flipped(checked_frame(0, self.source.read(0, end)), (20 + 25) * 8)
        with capturedLogs() as events:
            connection.dataReceived(code(CHECKED_ACK) + damaged)
        self.assertEqual(self.replica.max_offset, 0)
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(connection.factory.checksum_failures, 1)
        text = "".join(formatEvent(e) for e in events)
        self.assertIn(f"the frame of {end} bytes at offset 0 fails its checksum", text)
        self.assertIn("nothing of it was written", text)
        self.assertEqual(self.suspects, 0)

    def test_frames_before_a_damaged_frame_written(self) -> None:
        """
        One read with two good frames and a damaged third: the good ones
        are appended (as if they had come alone), nothing of the damaged
        one, nothing is acknowledged, and the connection is dropped.
        """
        connection, transport = self.connect()
        transport.clear()
        end = self.source.max_offset
        good = checked_frame(0, self.source.read(0, 300)) + checked_frame(
            300, self.source.read(300, 400)
        )
        damaged = flipped(checked_frame(700, self.source.read(700, end - 700)), (20 + 25) * 8)
        connection.dataReceived(code(CHECKED_ACK) + good + damaged)
        self.assertEqual(self.replica.max_offset, 700)
        self.assertEqual(self.replica.read(0, 700), self.source.read(0, 700))
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(connection.factory.checksum_failures, 1)

    def test_master_not_confirming_is_suspect(self) -> None:
        """
        A master that answers CHECKED_HELLO with a classic frame is not the
        master the last check saw: drop, and ask for a new check.
        """
        connection, transport = self.connect()
        end = self.source.max_offset
        connection.dataReceived(struct.pack(">qi", 0, end) + self.source.read(0, end))
        self.assertEqual(self.replica.max_offset, 0)
        self.assertTrue(transport.disconnecting)
        connection.connectionLost()
        self.assertEqual(self.suspects, 1)


class ConversationTests(SlaveTestCase):
    """
    A master and a slave in memory with bytes damaged between them.
    """

    def replicate(
        self, checked: bool, damage: Callable[[bytes, bool], bytes], rounds: int = 200
    ) -> tuple[MasterFactory, SlaveFactory]:
        """
        Connect, pump, and reconnect whenever a side drops, until the slave
        has the master's whole log (or C{rounds} connections).
        """
        master = MasterFactory(self.source, self.clock)
        self.addCleanup(master.stopFactory)
        slave = SlaveFactory(self.replica, self.clock)
        slave.checked = checked
        for _ in range(rounds):
            wire = connect_in_memory(master, slave, self.clock, fault=damage, read_size=1024)
            wire.slave.send_report()
            wire.flush()
            done = self.replica.record_end == self.source.max_offset
            whole = not wire.dropped
            wire.hang_up()
            if whole and done:
                break
        return master, slave

    def test_classic_replicates_a_damaged_header_field(self) -> None:
        """
        Why checked framing exists: over classic framing, a bit flipped in
        a record's queue offset (not covered by the body CRC) passes every
        check a slave can make and is replicated.
        """
        self.assertNotEqual(self._one_flip(checked=False), self._master_files())

    def test_checked_refetches_a_damaged_header_field(self) -> None:
        """
        With checked framing the same flip is caught, nothing of the frame
        is written, and the re-fetched bytes end identical.
        """
        self.assertEqual(self._one_flip(checked=True), self._master_files())

    def _master_files(self) -> dict[str, bytes]:
        return segment_files(self.source.store_dir)

    def _one_flip(self, checked: bool) -> dict[str, bytes]:
        header = CHECKED_HEADER_SIZE if checked else 12
        # The first frame: after the confirmation, the header, then the
        # first record's QUEUEOFFSET (record bytes 20..27).
        position = (8 if checked else 0) + header + 26
        done = []

        def damage(data: bytes, to_slave: bool) -> bytes:
            if to_slave and not done and len(data) > position:
                done.append(True)
                return flipped(data, position * 8 + 3)
            return data

        _, slave = self.replicate(checked, damage)
        self.assertEqual(done, [True])
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(slave.checksum_failures, 1 if checked else 0)
        return segment_files(self.replica.store_dir)

    def test_random_flips_both_ways(self) -> None:
        """
        Bits flipped at random in both directions, many times: every one
        is caught (by checksum; never by the slave's record validation, so
        nothing damaged was ever written), and the logs end identical.
        """
        for _ in range(400):
            self.source.put(make_message(b"r" * 500))
        rng = random.Random(7)
        flips = {"to_slave": 0, "to_master": 0}

        def damage(data: bytes, to_slave: bool) -> bytes:
            if rng.random() < (0.06 if to_slave else 0.2):
                flips["to_slave" if to_slave else "to_master"] += 1
                return flipped(data, rng.randrange(len(data) * 8))
            return data

        with capturedLogs() as events:
            master, slave = self.replicate(True, damage)
        self.assertEqual(self._master_files(), segment_files(self.replica.store_dir))
        self.assertGreater(flips["to_slave"], 10)
        self.assertGreater(flips["to_master"], 0)
        self.assertGreater(slave.checksum_failures, 5)
        self.assertGreater(master.checksum_failures, 0)
        text = "\n".join(formatEvent(e) for e in events)
        self.assertNotIn("is corrupt", text)


class ProbeTests(SynchronousTestCase):
    """
    L{probe}: rmqha, classic, or a check that could not finish.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.endpoint = StringEndpoint()

    def start(self) -> tuple[Deferred[Any], ControlClient, StringTransport]:
        d = Deferred.fromCoroutine(probe(self.clock, self.endpoint, timeout=3.0))
        client, transport = self.endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        return d, client, transport

    def test_info(self) -> None:
        """
        INFO: the session and what the master offers.
        """
        d, client, _ = self.start()
        client.dataReceived(encode_control_info(0, 100, SEGMENT, FEATURE_CHECKED_FRAMING))
        session = self.successResultOf(d)
        assert session is not None
        self.assertTrue(session[1].checked_framing)

    def test_classic_heartbeat(self) -> None:
        """
        Anything but INFO (say a heartbeat at the probe's value): classic.
        """
        d, client, _ = self.start()
        client.dataReceived(encode_code(CONTROL_PROBE) + struct.pack(">i", 0))
        self.assertIsNone(self.successResultOf(d))

    def test_classic_silence(self) -> None:
        """
        Nothing at all within the timeout, connection open: classic.
        """
        d, _, transport = self.start()
        self.clock.advance(3.0)
        self.assertIsNone(self.successResultOf(d))
        self.assertTrue(transport.disconnecting)

    def test_partial_info_is_not_classic(self) -> None:
        """
        Part of an INFO by the timeout is a stalled rmqha master: the check
        failed, it is not classic.
        """
        d, client, _ = self.start()
        client.dataReceived(encode_control_info(0, 100, SEGMENT, 1)[:20])
        self.clock.advance(3.0)
        self.failureResultOf(d, CheckFailed)

    def test_refused(self) -> None:
        """
        CONTROL_REFUSED to the probe (an rmqha master older than the probe,
        or the probe damaged on the way): asked again at once with
        CONTROL_HELLO on a new connection, which such a master answers.
        """
        d, client, _ = self.start()
        client.dataReceived(code(CONTROL_REFUSED))
        self.assertNoResult(d)
        again, transport = self.endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_HELLO))
        again.dataReceived(encode_control_info(0, 100, SEGMENT, 0))
        session = self.successResultOf(d)
        assert session is not None
        self.assertEqual(session[1].max_offset, 100)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_refused_twice(self) -> None:
        """
        CONTROL_REFUSED to the probe and then to CONTROL_HELLO: the check
        failed (not classic: only an rmqha master refuses).
        """
        d, client, _ = self.start()
        client.dataReceived(code(CONTROL_REFUSED))
        again, _ = self.endpoint.connected[-1]
        again.dataReceived(code(CONTROL_REFUSED))
        failure = self.failureResultOf(d, CheckFailed)
        self.assertIn("refused the control hello", failure.getErrorMessage())

    def test_damaged_info(self) -> None:
        """
        A damaged INFO: the check failed (a damaged INFO could otherwise
        claim the slave is ahead, and halt it).
        """
        d, client, _ = self.start()
        client.dataReceived(flipped(encode_control_info(0, 100, SEGMENT, 1), 8 * 20))
        failure = self.failureResultOf(d, CheckFailed)
        self.assertIn("fails its checksum", failure.getErrorMessage())

    def test_unreachable(self) -> None:
        """
        A refused connection: the check failed.
        """
        self.endpoint.refuse = True
        d = Deferred.fromCoroutine(probe(self.clock, self.endpoint))
        self.failureResultOf(d, CheckFailed)

    def test_digest_timeout_and_damage(self) -> None:
        """
        A DIGEST answer that never comes fails after the digest timeout; a
        damaged one fails at once; either way as L{CheckFailed}.
        """
        from rmqha.ha.control import DIGEST_TIMEOUT

        d, client, transport = self.start()
        client.dataReceived(encode_control_info(0, 100, SEGMENT, 1))
        self.successResultOf(d)
        waiting = client.digest(0, 10)
        self.clock.advance(DIGEST_TIMEOUT)
        self.failureResultOf(waiting, CheckFailed)
        self.assertTrue(transport.disconnecting)

        d, client, transport = self.start()
        client.dataReceived(encode_control_info(0, 100, SEGMENT, 1))
        waiting = client.digest(0, 10)
        client.dataReceived(flipped(encode_digest_answer(0, 10, bytes(16)), 8 * 30))
        self.failureResultOf(waiting, CheckFailed)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class BrokerCheckTests(SynchronousTestCase):
    """
    A slave broker replicates only after a check of its master finished,
    retrying failed checks with a back-off, and asks for checked framing
    when the master offers it.
    """

    def test_failed_checks_retried_then_replication_starts(self) -> None:
        reactor = MemoryReactorClock()
        endpoint = StringEndpoint(refuse=True)
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.SLAVE, master_endpoint=endpoint),  # type: ignore[arg-type]
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
        )
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(broker.stopService)
            self.assertEqual(replication_of(broker).failed_checks, 1)
            reactor.advance(2.0)  # 1 s and up to 1 s of jitter
            self.assertEqual(replication_of(broker).failed_checks, 2)
        warnings = [formatEvent(e) for e in events if "cannot reach master" in formatEvent(e)]
        self.assertEqual(len(warnings), 2)
        self.assertIn("Connection was refused by other side; retrying in ", warnings[0])
        assert broker.ha_service is not None and replica_of(broker).slave_factory is not None
        self.assertFalse(broker.ha_service.running)
        self.assertEqual(endpoint.connected, [])

        endpoint.refuse = False
        reactor.advance(3.5)  # 1.5 s and up to 1 s of jitter
        client, transport = endpoint.connected[0]
        client.dataReceived(encode_control_info(0, 0, 64 * 1024, FEATURE_CHECKED_FRAMING))
        self.assertEqual(replication_of(broker).failed_checks, 0)
        self.assertTrue(broker.ha_service.running)
        self.assertTrue(replication_of(broker).checked)
        # The replication connection asks for checked framing.
        _, replication_transport = endpoint.connected[-1]
        self.assertEqual(
            replication_transport.value()[:8], encode_code(CHECKED_HELLO)
        )
