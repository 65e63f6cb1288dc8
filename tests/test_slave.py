"""
Tests for L{rmqha.ha.slave}: the slave's side against C{StringTransport} and
a C{Clock}, the reconnecting service against a fake endpoint, and a whole
master-to-slave conversation in memory.
"""

from __future__ import annotations

import socket
import struct

from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha.config import HAConfig
from rmqha.ha.master import MasterFactory
from rmqha.ha import slave
from rmqha.ha.slave import SlaveConnection, SlaveFactory, make_slave_service
from rmqha.testing import MemoryConnection, StringEndpoint, connect_in_memory

from tests._helpers import (
    disk,
    make_message,
    open_store,
    replica_records,
    segment_files,
)

SEGMENT = 4096


def frame(offset: int, body: bytes = b"") -> bytes:
    """
    A master frame, by hand: int64 offset, int32 size, body.
    """
    return struct.pack(">qi", offset, len(body)) + body


def reports(data: bytes) -> list[int]:
    """
    The offsets in what the slave wrote, by hand.
    """
    assert len(data) % 8 == 0
    return [struct.unpack_from(">q", data, i)[0] for i in range(0, len(data), 8)]


class SlaveTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.source = open_store(self, segment_size=SEGMENT)
        self.replica = open_store(self, segment_size=SEGMENT)

    def fill(self, count: int, body: bytes = b"s" * 300) -> None:
        for _ in range(count):
            self.source.put(make_message(body))

    def source_bytes(self, start: int, end: int) -> bytes:
        out = b""
        while start < end:
            chunk = self.source.read(start, end - start)
            out += chunk
            start += len(chunk)
        return out

    def connect(self, **config: object) -> tuple[SlaveConnection, StringTransport]:
        factory = SlaveFactory(self.replica, self.clock, HAConfig(**config))  # type: ignore[arg-type]
        connection = factory.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        return connection, transport

    def _lose(self, connection: SlaveConnection) -> None:
        connection.connectionLost()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class FrameTests(SlaveTestCase):
    """
    Frames are appended at exactly their offset.
    """

    def test_first_report_is_max_offset(self) -> None:
        """
        The first report is the slave's max offset (0 when empty).
        """
        connection, transport = self.connect()
        connection.send_report()
        self.assertEqual(transport.value(), struct.pack(">q", 0))

    def test_frames_appended_then_one_report(self) -> None:
        """
        A frame is appended once complete; frames completed by one read
        are appended in order and answered by one report of the new max
        offset.
        """
        self.fill(10)
        end = self.source.max_offset
        data = frame(0, self.source_bytes(0, 1000)) + frame(1000, self.source_bytes(1000, end))
        connection, transport = self.connect()
        connection.send_report()
        transport.clear()
        connection.dataReceived(data[:700])
        self.assertEqual(self.replica.max_offset, 0)
        self.assertEqual(transport.value(), b"")
        connection.dataReceived(data[700:])
        self.assertEqual(self.replica.max_offset, end)
        self.assertEqual(self.replica.read(0, end), self.source.read(0, end))
        self.assertEqual(reports(transport.value()), [end])

    def test_frames_of_one_read_appended_as_one(self) -> None:
        """
        The frames one read completes are appended by one C{append_at} (one
        write, one validation pass; a record cut by a frame boundary is not
        read back), across a segment boundary too, and the log holds
        exactly the master's bytes.
        """
        self.fill(30)
        end = self.source.max_offset
        self.assertGreater(end, SEGMENT)
        cuts = [0, 700, 1000, 3000, SEGMENT + 10, end]
        data = b"".join(
            frame(a, self.source_bytes(a, b)) + frame(b) for a, b in zip(cuts, cuts[1:])
        )
        connection, transport = self.connect()
        calls = []
        append_at = self.replica.append_at

        def counting(offset: int, chunk: bytes) -> int:
            calls.append((offset, len(chunk)))
            return append_at(offset, chunk)

        self.replica.append_at = counting  # type: ignore[method-assign]
        connection.send_report()
        transport.clear()
        connection.dataReceived(data)
        self.assertEqual(calls, [(0, end)])
        copied = b""
        while len(copied) < end:
            copied += self.replica.read(len(copied), end - len(copied))
        self.assertEqual(copied, self.source_bytes(0, end))
        self.assertEqual(reports(transport.value()), [self.replica.record_end])
        self.assertTrue(connection.caught_up)
        self.assertEqual(connection.factory.bytes_received, end)

    def test_large_frames_appended_as_pieces(self) -> None:
        """
        Frames whose bodies average at least C{_PIECES_FROM} (a master's
        catch-up frames) are appended by one C{append_at} of the bodies as
        they are (one pwritev, not joined), across a segment boundary too;
        the log holds exactly the master's bytes, every record validated.
        """
        self.patch(slave, "_PIECES_FROM", 600)
        self.fill(30)
        end = self.source.max_offset
        self.assertGreater(end, SEGMENT)
        cuts = [0, 700, 1400, SEGMENT, SEGMENT + 900, end]
        data = b"".join(frame(a, self.source_bytes(a, b)) for a, b in zip(cuts, cuts[1:]))
        connection, transport = self.connect()
        calls = []
        append_at = self.replica.append_at

        def counting(offset: int, chunk: object) -> int:
            calls.append((offset, [len(piece) for piece in chunk]))  # type: ignore[attr-defined]
            return append_at(offset, chunk)  # type: ignore[arg-type]

        self.replica.append_at = counting  # type: ignore[method-assign]
        connection.send_report()
        transport.clear()
        connection.dataReceived(data)
        self.assertEqual(calls, [(0, [b - a for a, b in zip(cuts, cuts[1:])])])
        self.assertEqual(self.replica.record_end, end)
        self.assertEqual(disk(self.replica, 0, end), self.source_bytes(0, end))
        self.assertEqual(reports(transport.value()), [end])

    def test_frames_before_a_mismatch_appended(self) -> None:
        """
        A read whose third frame names a wrong offset: the two frames before
        it are appended, nothing after, and the connection is dropped
        without acknowledging anything.
        """
        self.fill(5)
        end = self.source.max_offset
        data = (
            frame(0, self.source_bytes(0, 500))
            + frame(500, self.source_bytes(500, 900))
            + frame(1000, self.source_bytes(1000, end))
        )
        connection, transport = self.connect()
        connection.send_report()
        transport.clear()
        with capturedLogs() as events:
            connection.dataReceived(data)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")
        self.assertEqual(self.replica.max_offset, 900)
        self.assertEqual(self.replica.read(0, 900), self.source_bytes(0, 900))
        text = " ".join(formatEvent(e) for e in events)
        self.assertIn("master sent offset 1000, this slave's max offset is 900", text)

    def test_empty_slave_accepts_last_segment_start(self) -> None:
        """
        A genuine RocketMQ master answers report 0 from the start of its
        last segment: an empty slave starts its log there.
        """
        self.fill(30)
        end = self.source.max_offset
        start = end - end % SEGMENT
        connection, _ = self.connect()
        connection.dataReceived(frame(start, self.source_bytes(start, end)))
        self.assertEqual(self.replica.min_offset, start)
        self.assertEqual(self.replica.max_offset, end)

    def test_offset_mismatch_drops(self) -> None:
        """
        A frame for any offset but the slave's max drops the connection,
        logging both offsets; nothing is appended.
        """
        self.fill(3)
        end = self.source.max_offset
        have = list(self.source.records())[1].next_offset
        self.replica.append_at(0, self.source_bytes(0, have))
        connection, transport = self.connect()
        with capturedLogs() as events:
            connection.dataReceived(frame(have + 100, self.source_bytes(have + 100, end)))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.replica.max_offset, have)
        text = " ".join(formatEvent(e) for e in events)
        self.assertIn(str(have + 100), text)
        self.assertIn(str(have), text)

    def test_corrupt_record_never_acknowledged(self) -> None:
        """
        A frame whose second record has a flipped body byte: the first
        record is kept, the slave drops the connection saying which record
        failed and why, and reports (acknowledges) nothing past the first
        record; reconnected, it asks for the bad record again.
        """
        self.fill(3)
        first = list(self.source.records())[0].next_offset
        data = bytearray(self.source_bytes(0, self.source.max_offset))
        data[first + 100] ^= 0x01
        connection, transport = self.connect()
        connection.send_report()
        transport.clear()
        with capturedLogs() as events:
            connection.dataReceived(frame(0, bytes(data)))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")
        self.assertEqual((self.replica.record_end, self.replica.max_offset), (first, first))
        text = " ".join(formatEvent(e) for e in events)
        self.assertIn(f"record at offset {first} is corrupt (body CRC mismatch)", text)
        connection.connectionLost()
        again, transport = self.connect()
        again.send_report()
        self.assertEqual(reports(transport.value()), [first])

    def test_same_record_rejected_again_backs_off(self) -> None:
        """
        The same record failing three times in a row is the master's own
        copy: the third drop says so and counts towards the back-off (as a
        connection that brought nothing would); the record coming good
        resets the count.
        """
        self.fill(3)
        first = list(self.source.records())[0].next_offset
        end = self.source.max_offset
        good = self.source_bytes(0, end)
        bad = bytearray(good)
        bad[first + 100] ^= 0x01
        factory = SlaveFactory(self.replica, self.clock)
        for attempt in (1, 2, 3):
            connection = factory.buildProtocol(None)
            transport = StringTransport()
            connection.makeConnection(transport)
            connection.send_report()
            have = self.replica.record_end
            with capturedLogs() as events:
                connection.dataReceived(frame(have, bytes(bad[have:])))
            connection.connectionLost()
            text = " ".join(formatEvent(e) for e in events)
            self.assertEqual(factory.rejections_in_a_row, attempt)
            if attempt < 3:
                self.assertIn("and will fetch it again", text)
                self.assertEqual(factory.fruitless_connections, 0)
        self.assertIn("damaged 3 times in a row", text)
        self.assertIn("its own copy is most likely corrupt", text)
        self.assertEqual(factory.fruitless_connections, 1)
        self.assertEqual(factory.rejected_records, 3)
        connection = factory.buildProtocol(None)
        connection.makeConnection(StringTransport())
        self.addCleanup(connection.connectionLost)
        connection.dataReceived(frame(first, good[first:]))
        self.assertEqual(self.replica.record_end, end)
        self.assertEqual((factory.rejected_offset, factory.rejections_in_a_row), (None, 0))

    def test_disk_full_backs_off_and_resumes(self) -> None:
        """
        The slave's disk full when a frame needs the next segment: the
        bytes before it are kept (and validated), the connection drops with
        one line naming the offset and the error, no traceback, counting
        towards the back-off; once there is room the rest lands after them
        and the replica is byte-identical.
        """
        import errno

        from rmqha.store import _segments

        self.fill(600)  # past one segment
        end = self.source.max_offset
        self.assertGreater(end, SEGMENT)
        good = self.source_bytes(0, end)
        factory = SlaveFactory(self.replica, self.clock)

        allocate = _segments._allocate
        made: list[int] = []

        def full_after_one(fd: int, size: int) -> None:
            # Room for the first segment only.
            if made:
                raise OSError(errno.ENOSPC, "No space left on device")
            made.append(fd)
            allocate(fd, size)

        patch = self.patch(_segments, "_allocate", full_after_one)
        connection = factory.buildProtocol(None)
        connection.makeConnection(StringTransport())
        with capturedLogs() as events:
            connection.dataReceived(frame(0, good))
        connection.connectionLost()
        text = " ".join(formatEvent(e) for e in events)
        self.assertIn(f"cannot append to the commit log at offset {SEGMENT}", text)
        self.assertIn("No space left on device", text)
        self.assertNotIn("Traceback", text)
        self.assertEqual(factory.fruitless_connections, 1)
        self.assertEqual(self.replica.max_offset, SEGMENT)
        self.assertEqual(self.replica.read(0, SEGMENT), good[:SEGMENT])
        patch.restore()
        connection = factory.buildProtocol(None)
        connection.makeConnection(StringTransport())
        self.addCleanup(connection.connectionLost)
        connection.dataReceived(frame(SEGMENT, good[SEGMENT:]))
        self.assertEqual(self.replica.record_end, end)
        copied, position = b"", 0
        while position < end:
            chunk = self.replica.read(position, end - position)
            copied, position = copied + chunk, position + len(chunk)
        self.assertEqual(copied, good)

    def test_partial_record_not_reported_and_refetched(self) -> None:
        """
        Bytes of a record still arriving are not acknowledged; a new
        connection discards them and asks for the record whole.
        """
        self.fill(2)
        first = list(self.source.records())[0].next_offset
        connection, transport = self.connect()
        connection.send_report()
        transport.clear()
        connection.dataReceived(frame(0, self.source_bytes(0, first + 50)))
        self.assertEqual(reports(transport.value()), [first])
        self.assertEqual(self.replica.max_offset, first + 50)
        connection.connectionLost()
        again, transport = self.connect()
        again.send_report()
        self.assertEqual(reports(transport.value()), [first])
        self.assertEqual(self.replica.max_offset, first)

    def test_heartbeat_mismatch_drops(self) -> None:
        """
        A heartbeat also carries the master's position: a wrong one drops.
        """
        self.replica.append_at(0, replica_records(0, 100))
        connection, transport = self.connect()
        connection.dataReceived(frame(100))
        self.assertFalse(transport.disconnecting)
        connection.dataReceived(frame(101))
        self.assertTrue(transport.disconnecting)

    def test_oversized_frame_drops(self) -> None:
        """
        A frame header announcing more than a RocketMQ slave accepts drops
        the connection before the body is buffered.
        """
        connection, transport = self.connect()
        connection.dataReceived(struct.pack(">qi", 0, 4 * 1024 * 1024))
        self.assertTrue(transport.disconnecting)


class _SizedTransport(StringTransport):
    """
    A StringTransport with a read size, like Twisted's TCP transports.
    """

    bufferSize = 64 * 1024


class ReadSizeTests(SlaveTestCase):
    """
    The slave sizes its reads by what the last one brought.
    """

    def test_full_reads_grow_small_reads_shrink(self) -> None:
        """
        A read that fills the buffer doubles the next one, up to 1 MiB; a
        read under an eighth of it halves it, down to 64 KiB.
        """
        factory = SlaveFactory(self.replica, self.clock, HAConfig())
        connection = factory.buildProtocol(None)
        transport = _SizedTransport()
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        sizes = []
        for received in [65536, 131072, 262144, 524288, 1048576, 1048576]:
            # Zero bytes are heartbeats at offset 0: valid for an empty slave.
            connection.dataReceived(b"\0" * received)
            sizes.append(transport.bufferSize)
        self.assertEqual(sizes, [131072, 262144, 524288, 1048576, 1048576, 1048576])
        sizes = []
        for _ in range(6):
            connection.dataReceived(frame(0))
            sizes.append(transport.bufferSize)
        self.assertEqual(sizes, [524288, 262144, 131072, 65536, 65536, 65536])
        connection.dataReceived(frame(0) * 1000)
        self.assertEqual(transport.bufferSize, 65536)


class _SocketTransport(_SizedTransport):
    """
    A sized StringTransport whose C{socket} is one end of a socket pair:
    what is sent into the other end is what the kernel still holds for the
    next read.
    """

    def __init__(self) -> None:
        super().__init__()
        self.socket, self.peer = socket.socketpair()

    def queue(self, data: bytes) -> None:
        self.peer.sendall(data)

    def drain(self) -> None:
        self.socket.setblocking(False)
        try:
            while self.socket.recv(65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.socket.close()
        self.peer.close()


class BatchedReadTests(SlaveTestCase):
    """
    Catching up on plain TCP, the slave has the socket wake it only once
    C{_BATCH_READS} bytes are in it, until reads stop for C{_BATCH_IDLE}.
    """

    def connect_socket(self) -> tuple[SlaveConnection, _SocketTransport]:
        factory = SlaveFactory(self.replica, self.clock, HAConfig())
        connection = factory.buildProtocol(None)
        transport = _SocketTransport()
        self.addCleanup(transport.close)
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        return connection, transport

    def threshold(self, transport: _SocketTransport) -> int:
        return transport.socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)

    def batch_timers(self, connection: SlaveConnection) -> list[object]:
        return [c for c in self.clock.getDelayedCalls() if c.func == connection._unbatch_reads]

    def test_catch_up_reads_batched_until_they_stop(self) -> None:
        """
        A read that fills the largest buffer (a MiB) sets the threshold,
        and busy polling stops; each read while it is on puts the end off;
        once no read has come for C{_BATCH_IDLE}, every byte wakes the
        reactor again.
        """
        connection, transport = self.connect_socket()
        self.assertEqual(self.threshold(transport), 1)
        transport.bufferSize = slave._MAX_READ_SIZE
        # Zero bytes are heartbeats at offset 0: valid for an empty slave.
        connection.dataReceived(b"\0" * slave._MAX_READ_SIZE)
        self.assertEqual(self.threshold(transport), slave._BATCH_READS)
        self.assertFalse(connection.expecting())
        for _ in range(3):
            self.clock.advance(slave._BATCH_IDLE * 0.9)
            connection.dataReceived(b"\0" * slave._BATCH_READS)
            self.assertEqual(self.threshold(transport), slave._BATCH_READS)
        self.clock.advance(slave._BATCH_IDLE)
        self.assertEqual(self.threshold(transport), 1)
        connection.dataReceived(b"\0" * 12)
        self.assertTrue(connection.expecting())

    def test_caught_up_reads_not_batched(self) -> None:
        """
        Reads that do not fill a MiB (a caught-up slave, a SYNC_MASTER's
        frames, a read buffer not grown yet) leave every byte waking the
        reactor.
        """
        connection, transport = self.connect_socket()
        for size in (12, 65536, slave._MAX_READ_SIZE * 15 // 16 - 1):
            transport.bufferSize = size
            connection.dataReceived(b"\0" * size)
            self.assertEqual(self.threshold(transport), 1, size)
        self.assertEqual(self.batch_timers(connection), [])

    def test_lost_while_batching(self) -> None:
        """
        A connection lost while reads are batched leaves nothing scheduled.
        """
        connection, transport = self.connect_socket()
        transport.bufferSize = slave._MAX_READ_SIZE
        connection.dataReceived(b"\0" * slave._MAX_READ_SIZE)
        self.assertEqual(len(self.batch_timers(connection)), 1)
        connection.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(self.batch_timers(connection), [])

    def test_no_socket_no_batching(self) -> None:
        """
        A transport without a socket option to set (here: none at all)
        reads as before, and is not asked again.
        """
        factory = SlaveFactory(self.replica, self.clock, HAConfig())
        connection = factory.buildProtocol(None)
        transport = _SizedTransport()
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        transport.bufferSize = slave._MAX_READ_SIZE
        connection.dataReceived(b"\0" * slave._MAX_READ_SIZE)
        self.assertEqual(self.batch_timers(connection), [])
        self.assertFalse(connection._can_batch)


class DeferredReportTests(SlaveTestCase):
    """
    On plain TCP, a read followed by more bytes already in the socket is
    acknowledged by the next read's report.
    """

    def connect_socket(self, **factory_args: object) -> tuple[SlaveConnection, _SocketTransport]:
        factory = SlaveFactory(self.replica, self.clock, HAConfig(), **factory_args)  # type: ignore[arg-type]
        connection = factory.buildProtocol(None)
        transport = _SocketTransport()
        self.addCleanup(transport.close)
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        connection.send_report()
        transport.clear()
        return connection, transport

    def read(self, connection: SlaveConnection, transport: _SocketTransport, data: bytes) -> None:
        """
        A read that fills the read buffer (as while catching up).
        """
        transport.bufferSize = len(data)
        connection.dataReceived(data)

    def test_report_waits_for_the_socket_to_drain(self) -> None:
        """
        Reads that fill the buffer with more bytes queued behind them
        append but do not report; the read that leaves the socket empty
        reports everything once.  A read that did not fill the buffer (a
        caught-up slave, a SYNC_MASTER's frame) reports at once, queued
        bytes or not.
        """
        self.fill(10)
        end = self.source.max_offset
        connection, transport = self.connect_socket()
        transport.queue(b"x")
        connection.dataReceived(frame(0, self.source_bytes(0, 500)))
        self.assertEqual(self.replica.max_offset, 500)
        self.assertEqual(reports(transport.value()), [self.replica.record_end])
        transport.clear()
        self.read(connection, transport, frame(500, self.source_bytes(500, 1000)))
        self.read(connection, transport, frame(1000, self.source_bytes(1000, 2000)))
        self.assertEqual(self.replica.max_offset, 2000)
        self.assertEqual(transport.value(), b"")
        transport.drain()
        self.read(connection, transport, frame(2000, self.source_bytes(2000, end)))
        self.assertEqual(reports(transport.value()), [end])

    def test_report_at_least_every_so_many_bytes(self) -> None:
        """
        However long the socket stays full, a report goes out once
        C{_REPORT_AT_LEAST} bytes are unreported (and only whole, validated
        records are reported).
        """
        self.patch(slave, "_REPORT_AT_LEAST", 1500)
        self.fill(20)
        connection, transport = self.connect_socket()
        transport.queue(b"x")
        for start in range(0, 6000, 500):
            self.read(connection, transport, frame(start, self.source_bytes(start, start + 500)))
        sent = reports(transport.value())
        self.assertGreaterEqual(len(sent), 2)
        # (A read brings 500 bytes: never more than 1500 + 500 unreported.)
        for before, after in zip([0, *sent], sent):
            self.assertTrue(1500 <= after - before <= 2000, (before, after))
        for offset in sent:
            self.assertEqual(offset, self.replica.record_start_at_or_before(offset))

    def test_pausing_reports_what_waited(self) -> None:
        """
        A read that pauses reading (too much unflushed) reports at once:
        the next read, which would have, waits for a flush.
        """
        self.fill(20)
        connection, transport = self.connect_socket(
            max_unflushed=3000, request_flush=lambda: None
        )
        transport.queue(b"x")
        self.read(connection, transport, frame(0, self.source_bytes(0, 2000)))
        self.assertEqual(transport.value(), b"")
        self.read(connection, transport, frame(2000, self.source_bytes(2000, 4000)))
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(reports(transport.value()), [self.replica.record_end])


class TimerTests(SlaveTestCase):
    """
    Reports on a timer, and read-idle housekeeping.
    """

    def test_periodic_report(self) -> None:
        """
        With nothing arriving, the slave reports every heartbeat interval.
        """
        connection, transport = self.connect(heartbeat_interval=5.0)
        connection.send_report()
        transport.clear()
        self.clock.advance(4.9)
        self.assertEqual(transport.value(), b"")
        self.clock.advance(0.1)
        self.assertEqual(reports(transport.value()), [0])

    def test_silent_master_dropped(self) -> None:
        """
        A master that sends nothing for the housekeeping interval is
        dropped; heartbeats keep the connection.
        """
        connection, transport = self.connect(
            heartbeat_interval=5.0, housekeeping_interval=20.0
        )
        for _ in range(3):
            self.clock.advance(10)
            connection.dataReceived(frame(0))
        self.assertFalse(transport.disconnecting)
        self.clock.advance(20)
        self.assertTrue(transport.disconnecting)


class BackpressureTests(SlaveTestCase):
    """
    The slave stops reading while too much received data is unflushed.
    """

    def test_pause_until_flushed(self) -> None:
        """
        Past C{max_unflushed} unflushed bytes the slave pauses its transport
        and asks for a flush at once; it reads again only when a flush has
        brought the backlog under half the limit.
        """
        self.fill(20)
        end = self.source.max_offset
        flushes = []
        factory = SlaveFactory(
            self.replica, self.clock, HAConfig(),
            max_unflushed=3000, request_flush=lambda: flushes.append(1),
        )
        connection = factory.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(self._lose, connection)
        connection.dataReceived(frame(0, self.source_bytes(0, 2000)))
        self.assertEqual(transport.producerState, "producing")
        connection.dataReceived(frame(2000, self.source_bytes(2000, 4000)))
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(flushes, [1])
        factory.flushed()  # a flush that did not reach the store: still paused
        self.assertEqual(transport.producerState, "paused")
        self.assertEqual(len(flushes), 2)
        self.replica.flush()
        factory.flushed()
        self.assertEqual(transport.producerState, "producing")
        connection.dataReceived(frame(4000, self.source_bytes(4000, end)))
        self.assertEqual(self.replica.max_offset, end)

    def test_no_limit(self) -> None:
        """
        Without a limit (SYNC_FLUSH slaves flush every append) the slave
        never pauses.
        """
        self.fill(20)
        end = self.source.max_offset
        connection, transport = self.connect()
        connection.dataReceived(frame(0, self.source_bytes(0, end)))
        self.assertEqual(transport.producerState, "producing")


class ServiceTests(SlaveTestCase):
    """
    L{make_slave_service}: a reconnecting client.
    """

    def test_report_at_connect_and_reconnect(self) -> None:
        """
        The first report goes out as the connection is made (not after the
        5 s timer); after a drop the service reconnects after a back-off
        and reports again.
        """
        endpoint = StringEndpoint()
        factory = SlaveFactory(self.replica, self.clock, HAConfig())
        service = make_slave_service(
            endpoint, factory, self.clock, retry_policy=lambda attempt: 2.0
        )
        service.startService()
        (protocol, transport), = endpoint.connected
        self.assertEqual(reports(transport.value()), [0])
        protocol.dataReceived(frame(0, replica_records(0, 100)))
        protocol.dataReceived(frame(5))
        self.assertTrue(transport.disconnecting)
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(endpoint.connected), 1)
        self.clock.advance(2.0)
        self.assertEqual(len(endpoint.connected), 2)
        self.assertEqual(reports(endpoint.connected[1][1].value()), [100])
        d = service.stopService()
        endpoint.connected[1][0].connectionLost(Failure(ConnectionDone()))
        self.successResultOf(d)
        self.assertEqual(self.clock.getDelayedCalls(), [])


    def test_fruitless_connections_lengthen_backoff(self) -> None:
        """
        A connection that ends before the master sent anything (a refused
        TLS handshake, a master dropping us at once) counts as a failed
        attempt: the back-off grows.  One that brought data resets it.
        """
        endpoint = StringEndpoint()
        factory = SlaveFactory(self.replica, self.clock, HAConfig())
        attempts: list[int] = []

        def policy(attempt: int) -> float:
            attempts.append(attempt)
            return 1.0

        service = make_slave_service(endpoint, factory, self.clock, retry_policy=policy)
        service.startService()
        for _ in range(3):
            protocol, _ = endpoint.connected[-1]
            protocol.connectionLost(Failure(ConnectionDone()))
            self.clock.advance(1.0)
        protocol, _ = endpoint.connected[-1]
        protocol.dataReceived(frame(0))
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(attempts, [2, 3, 4, 1])
        self.clock.advance(1.0)
        d = service.stopService()
        endpoint.connected[-1][0].connectionLost(Failure(ConnectionDone()))
        self.successResultOf(d)


class ConversationTests(SlaveTestCase):
    """
    A master and a slave talking in memory end with identical logs.
    """

    def converse(self, master: MasterFactory, slave: SlaveFactory) -> MemoryConnection:
        connection = connect_in_memory(master, slave, self.clock)
        connection.flush()
        connection.slave.send_report()
        self.addCleanup(connection.hang_up)
        return connection

    def test_replicates_and_follows(self) -> None:
        """
        An empty slave receives the whole log over several segments, then
        follows new puts; the segment files end byte-identical, and the
        master sees the slave's ack at its max offset.
        """
        self.fill(40)
        master = MasterFactory(self.source, self.clock)
        slave = SlaveFactory(self.replica, self.clock)
        connection = self.converse(master, slave)
        connection.flush()
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.fill(25)
        master.notify_appended()
        self.clock.advance(0)
        connection.flush()
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(
            segment_files(self.replica.store_dir), segment_files(self.source.store_dir)
        )
        (status,) = master.slaves()
        self.assertEqual(status.ack_offset, self.source.max_offset)
        self.assertEqual(status.lag_bytes, 0)
