"""
Tests for L{rmqha.ha._wire}: the classic RocketMQ HA wire protocol.

Expected bytes are written out by hand or built with C{struct} from the
layouts in the reference notes (sections A.2 and A.6), never with the code
under test.  Decoders are fed one byte at a time and in random chunkings.
"""

from __future__ import annotations

import itertools
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CHECKED_ACK,
    CHECKED_HELLO,
    CONTROL_HELLO,
    CONTROL_PROBE,
    Greeting,
    encode_identify,
    sniff_greeting,
    HEADER_SIZE,
    MAX_BODY_SIZE,
    REPORT_SIZE,
    ProtocolError,
    ReportDecoder,
    TransferDecoder,
    TransferFrame,
    encode_checked_header,
    encode_code,
    encode_header,
    encode_report,
)

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
#: C{HAClient.READ_MAX_BUFFER_SIZE} is 4 MiB and holds the 12-byte header.
EXPECTED_MAX_BODY_SIZE = 4 * 1024 * 1024 - 12


def report(offset: int) -> bytes:
    """
    A slave report, built independently of L{encode_report}.
    """
    return struct.pack(">q", offset)


def frame(offset: int, body: bytes = b"") -> bytes:
    """
    A master frame, built independently of L{encode_header}.
    """
    return struct.pack(">qi", offset, len(body)) + body


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """
    C{data} cut at the (unsorted, possibly repeated) positions C{cuts}:
    repeated cuts give empty chunks.
    """
    bounds = [0] + sorted(cuts) + [len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def drain(
    decoder: TransferDecoder, into: list[TransferFrame] | None = None
) -> list[TransferFrame]:
    """
    Every frame the decoder can return now, appended to C{into} as they
    come (so they are kept if a later one raises).
    """
    frames = [] if into is None else into
    while (f := decoder.next_frame()) is not None:
        frames.append(f)
    return frames


def reference_parse(
    stream: bytes, max_body_size: int
) -> tuple[list[tuple[int, bytes]], bool]:
    """
    An independent parser of a whole master stream: the complete frames
    before the first invalid header, and whether an invalid header (whole
    12 bytes present) was reached.
    """
    frames = []
    position = 0
    while len(stream) - position >= 12:
        offset, size = struct.unpack_from(">qi", stream, position)
        if offset < 0 or not 0 <= size <= max_body_size:
            return frames, True
        if len(stream) - position - 12 < size:
            break
        frames.append((offset, stream[position + 12 : position + 12 + size]))
        position += 12 + size
    return frames, False


OFFSETS = st.integers(0, INT64_MAX)
BODIES = st.one_of(st.just(b""), st.binary(max_size=3000))
FRAMES = st.lists(st.tuples(OFFSETS, BODIES), max_size=12)


class GreetingTests(SynchronousTestCase):
    """
    L{sniff_greeting}: what the first 8 bytes on a master's HA port say.
    """

    def test_kinds(self) -> None:
        """
        A report is classic; CHECKED_HELLO, the two control hellos and
        IDENTIFY are rmqha's; any other negative value is refused; fewer
        than 8 bytes say nothing yet.
        """
        cases = [
            (encode_report(0), Greeting.CLASSIC),
            (encode_report(12345) + b"more", Greeting.CLASSIC),
            (encode_code(CHECKED_HELLO), Greeting.CHECKED),
            (encode_code(CONTROL_PROBE), Greeting.CONTROL),
            (encode_code(CONTROL_HELLO), Greeting.CONTROL),
            (encode_identify("r1"), Greeting.IDENTIFY),
            (encode_code(-42), Greeting.REFUSED),
        ]
        for head, kind in cases:
            sniffed = sniff_greeting(head)
            assert sniffed is not None
            self.assertEqual(sniffed[0], kind, head)
        self.assertIsNone(sniff_greeting(encode_report(0)[:7]))
        self.assertEqual(sniff_greeting(encode_code(-42)), (Greeting.REFUSED, -42))


class ConstantsTests(SynchronousTestCase):
    """
    The sizes of the protocol.
    """

    def test_sizes(self) -> None:
        """
        A report is 8 bytes, a header 12, and a body at most 4 MiB minus the
        header (what a RocketMQ slave's read buffer can hold).
        """
        self.assertEqual(REPORT_SIZE, 8)
        self.assertEqual(HEADER_SIZE, 12)
        self.assertEqual(MAX_BODY_SIZE, EXPECTED_MAX_BODY_SIZE)

    def test_protocol_error_is_value_error(self) -> None:
        """
        L{ProtocolError} is a L{ValueError}, so callers that catch bad
        values catch it too.
        """
        self.assertTrue(issubclass(ProtocolError, ValueError))


class EncodeReportTests(SynchronousTestCase):
    """
    L{encode_report} writes a slave's max offset as 8 big-endian bytes.
    """

    def test_reference_example(self) -> None:
        """
        The report of 0x40000000 is the bytes given in reference A.6.
        """
        self.assertEqual(
            encode_report(0x40000000), bytes.fromhex("00 00 00 00 40 00 00 00")
        )

    def test_bounds(self) -> None:
        """
        0 and the largest int64 are encoded as 8 big-endian bytes.
        """
        self.assertEqual(encode_report(0), b"\x00" * 8)
        self.assertEqual(encode_report(INT64_MAX), b"\x7f" + b"\xff" * 7)
        self.assertEqual(encode_report(0x0102030405060708), bytes(range(1, 9)))

    def test_negative_refused(self) -> None:
        """
        A negative offset is a L{ValueError} naming the value.
        """
        for offset in [-1, -(2**63)]:
            e = self.assertRaises(ValueError, encode_report, offset)
            self.assertIn(str(offset), str(e))

    @settings(deadline=None, derandomize=True, max_examples=200)
    @given(offset=OFFSETS)
    def test_matches_struct(self, offset: int) -> None:
        """
        Every non-negative int64 encodes as C{struct.pack(">q", offset)}.
        """
        self.assertEqual(encode_report(offset), struct.pack(">q", offset))


class EncodeHeaderTests(SynchronousTestCase):
    """
    L{encode_header} writes a frame header: offset int64 BE, size int32 BE.
    """

    def test_reference_heartbeat(self) -> None:
        """
        The heartbeat at 0x40000000 is the bytes given in reference A.6.
        """
        self.assertEqual(
            encode_header(0x40000000, 0),
            bytes.fromhex("00 00 00 00 40 00 00 00") + bytes.fromhex("00 00 00 00"),
        )

    def test_reference_data_frame(self) -> None:
        """
        The header of a 32 KiB frame at 0x40000000 is the bytes given in
        reference A.6.
        """
        self.assertEqual(
            encode_header(0x40000000, 32 * 1024),
            bytes.fromhex("00 00 00 00 40 00 00 00") + bytes.fromhex("00 00 80 00"),
        )

    def test_largest_values(self) -> None:
        """
        The largest int64 offset and L{MAX_BODY_SIZE} itself are accepted.
        """
        self.assertEqual(
            encode_header(INT64_MAX, EXPECTED_MAX_BODY_SIZE),
            b"\x7f" + b"\xff" * 7 + bytes.fromhex("00 3f ff f4"),
        )

    def test_negative_offset_refused(self) -> None:
        """
        A negative offset is a L{ValueError} naming the value.
        """
        e = self.assertRaises(ValueError, encode_header, -7, 0)
        self.assertIn("-7", str(e))

    def test_size_out_of_range_refused(self) -> None:
        """
        A size below 0 or above L{MAX_BODY_SIZE} is a L{ValueError} naming
        the size.
        """
        for size in [-1, EXPECTED_MAX_BODY_SIZE + 1, INT32_MAX, 2**40]:
            e = self.assertRaises(ValueError, encode_header, 0, size)
            self.assertIn(str(size), str(e))

    @settings(deadline=None, derandomize=True, max_examples=200)
    @given(offset=OFFSETS, size=st.integers(0, EXPECTED_MAX_BODY_SIZE))
    def test_matches_struct(self, offset: int, size: int) -> None:
        """
        Every valid header encodes as C{struct.pack(">qi", offset, size)}.
        """
        self.assertEqual(encode_header(offset, size), struct.pack(">qi", offset, size))


class ReportDecoderTests(SynchronousTestCase):
    """
    L{ReportDecoder} parses reports the way RocketMQ's master does: the
    stream is cut into 8-byte values from its first byte, and of the values
    one read completes only the last counts.
    """

    VALUES = (0x40000000, 0x0102030405060708, INT64_MAX)
    STREAM = b"".join(struct.pack(">q", v) for v in VALUES)

    def test_reference_example(self) -> None:
        """
        The reference A.6 report bytes decode to 0x40000000.
        """
        decoder = ReportDecoder()
        self.assertEqual(
            decoder.feed(bytes.fromhex("00 00 00 00 40 00 00 00")), 0x40000000
        )
        self.assertEqual(decoder.count, 1)

    def test_empty_feed(self) -> None:
        """
        Feeding no bytes returns C{None} and counts nothing, before and
        after a partial report.
        """
        decoder = ReportDecoder()
        self.assertIsNone(decoder.feed(b""))
        self.assertEqual(decoder.count, 0)
        self.assertIsNone(decoder.feed(b"\x00\x00\x00"))
        self.assertIsNone(decoder.feed(b""))
        self.assertEqual(decoder.count, 0)
        self.assertEqual(decoder.feed(b"\x00\x00\x00\x00\x09"), 9)

    def test_last_of_several_wins(self) -> None:
        """
        Several reports in one feed: only the last is returned, and C{count}
        counts all of them.
        """
        decoder = ReportDecoder()
        self.assertEqual(decoder.feed(self.STREAM), INT64_MAX)
        self.assertEqual(decoder.count, 3)
        self.assertEqual(decoder.feed(report(5) + report(6)), 6)
        self.assertEqual(decoder.count, 5)

    def test_trailing_partial_ignored(self) -> None:
        """
        Complete reports followed by part of another: the last complete one
        is returned, and the partial one completes on a later feed.
        """
        decoder = ReportDecoder()
        self.assertEqual(decoder.feed(report(1) + report(2) + report(3)[:5]), 2)
        self.assertEqual(decoder.count, 2)
        self.assertEqual(decoder.feed(report(3)[5:]), 3)
        self.assertEqual(decoder.count, 3)

    def test_every_split(self) -> None:
        """
        Three reports cut into three feeds at every pair of points: each
        feed returns the last report it completes, or C{None}.
        """
        for i in range(len(self.STREAM) + 1):
            for j in range(i, len(self.STREAM) + 1):
                decoder = ReportDecoder()
                for start, end in [(0, i), (i, j), (j, len(self.STREAM))]:
                    got = decoder.feed(self.STREAM[start:end])
                    if end // 8 > start // 8:
                        expected = self.VALUES[end // 8 - 1]
                    else:
                        expected = None
                    self.assertEqual(got, expected, (i, j, start, end))
                    self.assertEqual(decoder.count, end // 8)

    def test_byte_at_a_time(self) -> None:
        """
        Fed one byte at a time, each report is returned by the feed of its
        eighth byte and every other feed returns C{None}.
        """
        decoder = ReportDecoder()
        for n in range(1, len(self.STREAM) + 1):
            got = decoder.feed(self.STREAM[n - 1 : n])
            expected = self.VALUES[n // 8 - 1] if n % 8 == 0 else None
            self.assertEqual(got, expected, n)
            self.assertEqual(decoder.count, n // 8)

    def test_alignment_from_stream_start(self) -> None:
        """
        Alignment is counted from the first byte of the stream: 5 bytes then
        11 bytes return the second report, not 8 bytes read across the
        boundary.
        """
        decoder = ReportDecoder()
        stream = report(0x1111) + report(0x2222)
        self.assertIsNone(decoder.feed(stream[:5]))
        self.assertEqual(decoder.feed(stream[5:]), 0x2222)
        self.assertEqual(decoder.count, 2)

    def test_negative_report(self) -> None:
        """
        A negative report is a L{ProtocolError} naming the value, also when
        it is completed across feeds.
        """
        e = self.assertRaises(ProtocolError, ReportDecoder().feed, report(-5))
        self.assertIn("-5", str(e))

        decoder = ReportDecoder()
        self.assertEqual(decoder.feed(report(3) + report(-(2**63))[:2]), 3)
        e = self.assertRaises(ProtocolError, decoder.feed, report(-(2**63))[2:])
        self.assertIn(str(-(2**63)), str(e))

    def test_skipped_negative_not_checked(self) -> None:
        """
        Like the Java master, only the last report of a read is looked at: a
        negative one before it in the same read is skipped.
        """
        decoder = ReportDecoder()
        self.assertEqual(decoder.feed(report(-1) + report(8)), 8)
        self.assertEqual(decoder.count, 2)

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(data=st.data(), stream=st.binary(max_size=100))
    def test_random_bytes(self, data: st.DataObject, stream: bytes) -> None:
        """
        Random bytes in random chunkings: every feed returns the last
        8-byte-aligned value it completes (counted from the stream start) or
        C{None}, or raises L{ProtocolError} when that value is negative;
        nothing else is ever raised.
        """
        cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
        decoder = ReportDecoder()
        fed = 0
        for chunk in split(stream, cuts):
            before, fed = fed, fed + len(chunk)
            if fed // 8 > before // 8:
                (expected,) = struct.unpack_from(">q", stream, fed // 8 * 8 - 8)
            else:
                expected = None
            if expected is not None and expected < 0:
                self.assertRaises(ProtocolError, decoder.feed, chunk)
                return
            self.assertEqual(decoder.feed(chunk), expected)
            self.assertEqual(decoder.count, fed // 8)


class TransferFrameTests(SynchronousTestCase):
    """
    L{TransferFrame} is one master frame.
    """

    def test_is_heartbeat(self) -> None:
        """
        A frame is a heartbeat exactly when its body is empty.
        """
        self.assertTrue(TransferFrame(0x40000000, b"").is_heartbeat)
        self.assertFalse(TransferFrame(0x40000000, b"\x00").is_heartbeat)
        self.assertFalse(TransferFrame(0, b"data").is_heartbeat)

    def test_fields(self) -> None:
        """
        A frame is the tuple C{(offset, body)}.
        """
        f = TransferFrame(7, b"abc")
        self.assertEqual((f.offset, f.body), (7, b"abc"))
        self.assertEqual(f, (7, b"abc"))


class TransferDecoderTests(SynchronousTestCase):
    """
    L{TransferDecoder} returns master frames from a byte stream, one per
    L{TransferDecoder.next_frame} call.
    """

    def test_reference_heartbeat(self) -> None:
        """
        The reference A.6 heartbeat bytes decode to a heartbeat at
        0x40000000.
        """
        decoder = TransferDecoder()
        decoder.feed(
            bytes.fromhex("00 00 00 00 40 00 00 00") + bytes.fromhex("00 00 00 00")
        )
        f = decoder.next_frame()
        self.assertEqual(f, TransferFrame(0x40000000, b""))
        self.assertTrue(f.is_heartbeat)
        self.assertIsNone(decoder.next_frame())
        self.assertEqual(decoder.buffered, 0)

    def test_reference_data_frame(self) -> None:
        """
        The reference A.6 32 KiB frame decodes to its offset and body; its
        header is reported as soon as its 12 bytes are in.
        """
        body = bytes(range(256)) * 128
        decoder = TransferDecoder()
        decoder.feed(
            bytes.fromhex("00 00 00 00 40 00 00 00") + bytes.fromhex("00 00 80 00")
        )
        self.assertEqual(decoder.pending_header(), (0x40000000, 32768))
        self.assertIsNone(decoder.next_frame())
        decoder.feed(body[:-1])
        self.assertIsNone(decoder.next_frame())
        self.assertEqual(decoder.buffered, 12 + 32767)
        decoder.feed(body[-1:])
        f = decoder.next_frame()
        self.assertEqual(f, TransferFrame(0x40000000, body))
        self.assertFalse(f.is_heartbeat)
        self.assertEqual(decoder.buffered, 0)

    def test_cut_frames_not_copied(self) -> None:
        """
        L{TransferDecoder.next_frame_pieces} returns a frame cut across
        reads as views of the reads it came in, nothing copied (catch-up
        frames make most of a backlog come this way); L{next_frame} joins
        them.  Short rests of a read are gathered in a buffer instead, so
        tiny reads cannot make a piece per byte.
        """
        first, second = b"a" * 10_000, b"b" * 9_000
        stream = encode_header(0, len(first)) + first + encode_header(10_000, len(second)) + second
        reads = [stream[:6_000], stream[6_000:15_000], stream[15_000:]]
        decoder = TransferDecoder()
        decoder.feed(reads[0])
        self.assertIsNone(decoder.next_frame_pieces())
        decoder.feed(reads[1])
        frame_ = decoder.next_frame_pieces()
        assert frame_ is not None
        offset, pieces = frame_
        self.assertEqual([p.obj for p in pieces], [reads[0], reads[1]])
        self.assertEqual((offset, b"".join(pieces)), (0, first))
        self.assertIsNone(decoder.next_frame_pieces())
        decoder.feed(reads[2])
        later = decoder.next_frame()
        assert later is not None
        self.assertEqual((later.offset, later.body), (10_000, second))
        self.assertEqual(decoder.buffered, 0)

        decoder = TransferDecoder()
        for i in range(len(stream)):
            decoder.feed(stream[i : i + 1])
            self.assertLessEqual(len(decoder._held), 1)
        self.assertEqual(drain(decoder), [TransferFrame(0, first), TransferFrame(10_000, second)])

    def test_header_read_once(self) -> None:
        """
        A frame arriving in many reads has its header gathered and checked
        once, not again on every read until its body is whole.
        """
        body = b"c" * 5_000
        stream = encode_header(7, len(body)) + body
        decoder = TransferDecoder()
        gathered = []
        header = decoder._header

        def counting() -> object:
            gathered.append(1)
            return header()

        decoder._header = counting  # type: ignore[method-assign]
        for start in range(0, len(stream), 500):
            decoder.feed(stream[start : start + 500])
            frames = drain(decoder)
        self.assertEqual(frames, [TransferFrame(7, body)])
        self.assertEqual(len(gathered), 2)  # (and once more for the next frame)

    def test_empty_decoder(self) -> None:
        """
        A new decoder has nothing buffered and no frame or header.
        """
        decoder = TransferDecoder()
        self.assertEqual(decoder.buffered, 0)
        self.assertIsNone(decoder.pending_header())
        self.assertIsNone(decoder.next_frame())
        decoder.feed(b"")
        self.assertIsNone(decoder.next_frame())

    def test_byte_at_a_time(self) -> None:
        """
        Frames fed one byte at a time: C{next_frame} returns C{None} until a
        frame's last byte is in, then that frame; C{pending_header} is
        C{None} until the 12th byte of a header, then C{(offset, size)};
        C{buffered} counts the bytes not yet returned.
        """
        frames = [
            (0x40000000, b""),
            (0x40000000, b"x" * 100),
            (0, b"\x00"),
            (INT64_MAX, b""),
            (12345, bytes(range(256))),
        ]
        decoder = TransferDecoder()
        for offset, body in frames:
            encoded = frame(offset, body)
            for n in range(1, len(encoded) + 1):
                decoder.feed(encoded[n - 1 : n])
                if n < 12:
                    self.assertIsNone(decoder.pending_header(), n)
                else:
                    self.assertEqual(decoder.pending_header(), (offset, len(body)))
                if n < len(encoded):
                    self.assertIsNone(decoder.next_frame(), n)
                    self.assertEqual(decoder.buffered, n)
            self.assertEqual(decoder.next_frame(), TransferFrame(offset, body))
            self.assertEqual(decoder.buffered, 0)
            self.assertIsNone(decoder.next_frame())
            self.assertIsNone(decoder.pending_header())

    def test_one_at_a_time(self) -> None:
        """
        Several frames fed at once are returned one per call, in order, so
        the caller can stop between them; what is left stays buffered.
        """
        decoder = TransferDecoder()
        decoder.feed(frame(1, b"a") + frame(2) + frame(3, b"ccc") + frame(4, b"d")[:12])
        self.assertEqual(decoder.next_frame(), TransferFrame(1, b"a"))
        self.assertEqual(decoder.buffered, 12 + 15 + 12)
        self.assertEqual(decoder.pending_header(), (2, 0))
        self.assertEqual(decoder.next_frame(), TransferFrame(2, b""))
        self.assertEqual(decoder.next_frame(), TransferFrame(3, b"ccc"))
        self.assertEqual(decoder.pending_header(), (4, 1))
        self.assertIsNone(decoder.next_frame())
        self.assertEqual(decoder.buffered, 12)
        # Feeding after frames were taken keeps the unconsumed tail.
        decoder.feed(b"d")
        self.assertEqual(decoder.buffered, 13)
        self.assertEqual(decoder.next_frame(), TransferFrame(4, b"d"))
        self.assertEqual(decoder.buffered, 0)

    @settings(deadline=None, derandomize=True, max_examples=150)
    @given(data=st.data(), frames=FRAMES)
    def test_random_chunking(
        self, data: st.DataObject, frames: list[tuple[int, bytes]]
    ) -> None:
        """
        Frames (heartbeats included) split at random points, empty feeds
        included: after each feed the decoder has returned exactly the
        frames wholly fed so far, in order, with their bodies, and
        C{buffered} is the rest; at the end nothing is buffered.
        """
        stream = b"".join(struct.pack(">qi", o, len(b)) + b for o, b in frames)
        ends = []
        end = 0
        for _, body in frames:
            end += 12 + len(body)
            ends.append(end)
        cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))

        decoder = TransferDecoder()
        got: list[TransferFrame] = []
        fed = 0
        for chunk in split(stream, cuts):
            decoder.feed(chunk)
            fed += len(chunk)
            got.extend(drain(decoder))
            complete = sum(1 for e in ends if e <= fed)
            self.assertEqual(got, [TransferFrame(o, b) for o, b in frames[:complete]])
            self.assertEqual(
                decoder.buffered, fed - (ends[complete - 1] if complete else 0)
            )
        self.assertEqual(len(got), len(frames))
        self.assertEqual(decoder.buffered, 0)

    @settings(deadline=None, derandomize=True, max_examples=25)
    @given(
        frames=st.lists(
            st.tuples(OFFSETS, st.one_of(st.just(b""), st.binary(max_size=300))),
            max_size=6,
        )
    )
    def test_random_frames_byte_at_a_time(
        self, frames: list[tuple[int, bytes]]
    ) -> None:
        """
        Random frames fed one byte at a time come out whole, in order, each
        from the feed of its last byte.
        """
        decoder = TransferDecoder()
        got: list[TransferFrame] = []
        for offset, body in frames:
            encoded = struct.pack(">qi", offset, len(body)) + body
            for n in range(len(encoded)):
                self.assertEqual(drain(decoder), [])
                decoder.feed(encoded[n : n + 1])
            got.extend(drain(decoder))
        self.assertEqual(got, [TransferFrame(o, b) for o, b in frames])
        self.assertEqual(decoder.buffered, 0)

    def test_max_body_size_accepted(self) -> None:
        """
        A body of exactly C{max_body_size} bytes is accepted.
        """
        decoder = TransferDecoder(max_body_size=100)
        decoder.feed(frame(9, b"z" * 100))
        self.assertEqual(decoder.next_frame(), TransferFrame(9, b"z" * 100))

    def test_oversized_header_only(self) -> None:
        """
        A size above C{max_body_size} is a L{ProtocolError} naming the size
        as soon as the 12-byte header is in, with none of the body fed.
        """
        decoder = TransferDecoder(max_body_size=100)
        decoder.feed(struct.pack(">qi", 77, 101)[:11])
        self.assertIsNone(decoder.next_frame())
        decoder.feed(struct.pack(">qi", 77, 101)[11:])
        self.assertEqual(decoder.buffered, 12)
        e = self.assertRaises(ProtocolError, decoder.next_frame)
        self.assertIn("101", str(e))
        e = self.assertRaises(ProtocolError, decoder.pending_header)
        self.assertIn("101", str(e))

    def test_oversized_default_limit(self) -> None:
        """
        With the default limit, sizes above L{MAX_BODY_SIZE} (up to the
        largest int32) are refused from the header alone.
        """
        for size in [EXPECTED_MAX_BODY_SIZE + 1, INT32_MAX]:
            decoder = TransferDecoder()
            decoder.feed(struct.pack(">qi", 0, size))
            e = self.assertRaises(ProtocolError, decoder.next_frame)
            self.assertIn(str(size), str(e))

    def test_largest_size_header(self) -> None:
        """
        With the default limit, a header of L{MAX_BODY_SIZE} is valid and
        waits for its body.
        """
        decoder = TransferDecoder()
        decoder.feed(struct.pack(">qi", 0, EXPECTED_MAX_BODY_SIZE))
        self.assertEqual(decoder.pending_header(), (0, EXPECTED_MAX_BODY_SIZE))
        self.assertIsNone(decoder.next_frame())

    def test_oversized_after_valid_frame(self) -> None:
        """
        Frames before an invalid header are returned; the error comes when
        the invalid header is reached.
        """
        decoder = TransferDecoder(max_body_size=100)
        decoder.feed(frame(1, b"ok") + struct.pack(">qi", 3, 1000))
        self.assertEqual(decoder.next_frame(), TransferFrame(1, b"ok"))
        e = self.assertRaises(ProtocolError, decoder.next_frame)
        self.assertIn("1000", str(e))

    def test_negative_size(self) -> None:
        """
        A negative size is a L{ProtocolError} naming the size.
        """
        for size in [-1, -(2**31)]:
            decoder = TransferDecoder()
            decoder.feed(struct.pack(">qi", 0, size))
            e = self.assertRaises(ProtocolError, decoder.next_frame)
            self.assertIn(str(size), str(e))

    def test_negative_offset(self) -> None:
        """
        A negative offset is a L{ProtocolError} naming the offset, for data
        frames and heartbeats.
        """
        for offset, size in [(-1, 0), (-(2**63), 4)]:
            decoder = TransferDecoder()
            decoder.feed(struct.pack(">qi", offset, size))
            e = self.assertRaises(ProtocolError, decoder.next_frame)
            self.assertIn(str(offset), str(e))
            self.assertRaises(ProtocolError, decoder.pending_header)

    def test_zero_limit(self) -> None:
        """
        C{max_body_size=0} allows heartbeats only.
        """
        decoder = TransferDecoder(max_body_size=0)
        decoder.feed(frame(5) + frame(6, b"x"))
        self.assertEqual(decoder.next_frame(), TransferFrame(5, b""))
        self.assertRaises(ProtocolError, decoder.next_frame)

    def test_limit_range(self) -> None:
        """
        C{max_body_size} outside 0..L{MAX_BODY_SIZE} is a L{ValueError}
        naming it; the bounds themselves are accepted, the default is
        L{MAX_BODY_SIZE}.
        """
        for limit in [-1, EXPECTED_MAX_BODY_SIZE + 1, INT32_MAX]:
            e = self.assertRaises(ValueError, TransferDecoder, limit)
            self.assertIn(str(limit), str(e))
        self.assertEqual(TransferDecoder(0).max_body_size, 0)
        self.assertEqual(
            TransferDecoder(EXPECTED_MAX_BODY_SIZE).max_body_size,
            EXPECTED_MAX_BODY_SIZE,
        )
        self.assertEqual(TransferDecoder().max_body_size, EXPECTED_MAX_BODY_SIZE)

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(
        data=st.data(),
        pieces=st.lists(
            st.one_of(
                st.binary(max_size=20),
                st.builds(
                    lambda o, b: struct.pack(">qi", o, len(b)) + b,
                    st.integers(-3, INT64_MAX),
                    st.binary(max_size=40),
                ),
            ),
            max_size=8,
        ),
        limit=st.integers(0, 60),
    )
    def test_random_bytes(
        self, data: st.DataObject, pieces: list[bytes], limit: int
    ) -> None:
        """
        Arbitrary bytes (random junk mixed with well-formed frames) in
        random chunkings either yield exactly the frames an independent
        parser finds, or raise L{ProtocolError} where it finds an invalid
        header; nothing else is ever raised, and returned plus buffered
        bytes always add up to the bytes fed.
        """
        stream = b"".join(pieces)
        expected, invalid = reference_parse(stream, limit)
        cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
        decoder = TransferDecoder(max_body_size=limit)
        got: list[TransferFrame] = []
        fed = 0
        try:
            for chunk in split(stream, cuts):
                decoder.feed(chunk)
                fed += len(chunk)
                drain(decoder, got)
                used = sum(12 + len(f.body) for f in got)
                self.assertEqual(used + decoder.buffered, fed)
        except ProtocolError:
            self.assertTrue(invalid, "ProtocolError on a valid stream")
            self.assertEqual(got, [TransferFrame(o, b) for o, b in expected])
        else:
            self.assertFalse(invalid, "invalid header not reported")
            self.assertEqual(got, [TransferFrame(o, b) for o, b in expected])


class TransferDecoderMemoryTests(SynchronousTestCase):
    """
    L{TransferDecoder} drops the bytes of returned frames, so a long stream
    drained as it arrives needs a bounded buffer.
    """

    COUNT = 10_000

    def test_one_frame_per_feed(self) -> None:
        """
        10,000 frames fed one per feed and drained each time never leave
        more than one frame's bytes in the buffer.
        """
        decoder = TransferDecoder()
        encoded = [frame(i * 20, i.to_bytes(4, "big") * 5) for i in range(self.COUNT)]
        size = len(encoded[0])
        for i, data in enumerate(encoded):
            decoder.feed(data)
            self.assertLessEqual(decoder._held_size, size)
            self.assertEqual(drain(decoder), [TransferFrame(i * 20, data[12:])])
        self.assertEqual(decoder.buffered, 0)

    def test_misaligned_feeds(self) -> None:
        """
        The same stream fed in 45-byte chunks that cut frames in the middle
        keeps the buffer below one frame's worth plus one chunk.
        """
        decoder = TransferDecoder()
        stream = b"".join(
            frame(i * 20, i.to_bytes(4, "big") * 5) for i in range(self.COUNT)
        )
        size = 32
        got = 0
        for start in range(0, len(stream), 45):
            decoder.feed(stream[start : start + 45])
            self.assertLess(decoder._held_size, size + 45)
            for f in drain(decoder):
                self.assertEqual(f.offset, got * 20)
                got += 1
        self.assertEqual(got, self.COUNT)
        self.assertEqual(decoder.buffered, 0)


class CheckedFramingPropertyTests(SynchronousTestCase):
    """
    Checked framing under Hypothesis: random frames round-trip whatever
    the cuts, and a damaged stream never yields a frame that differs from
    what was sent.
    """

    @staticmethod
    def stream(frames: list[tuple[int, bytes]]) -> bytes:
        return encode_code(CHECKED_ACK) + b"".join(
            encode_checked_header(o, b) + b for o, b in frames
        )

    @settings(deadline=None, derandomize=True, max_examples=200)
    @given(frames=FRAMES, cuts=st.lists(st.integers(0, 40_000), max_size=8))
    def test_round_trip(self, frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
        """
        Any frames, cut anywhere, come out as sent.
        """
        data = self.stream(frames)
        decoder = TransferDecoder(checked=True)
        out: list[TransferFrame] = []
        for chunk in split(data, [c % (len(data) + 1) for c in cuts]):
            decoder.feed(chunk)
            drain(decoder, out)
        self.assertEqual([(f.offset, bytes(f.body)) for f in out], frames)
        self.assertEqual(decoder.buffered, 0)

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(
        frames=FRAMES.filter(bool),
        position=st.integers(0, 1 << 20),
        xor=st.integers(1, 255),
        cut=st.integers(0, 1 << 20),
        truncate=st.booleans(),
    )
    def test_damage_never_yields_a_wrong_frame(
        self,
        frames: list[tuple[int, bytes]],
        position: int,
        xor: int,
        cut: int,
        truncate: bool,
    ) -> None:
        """
        One damaged byte (and maybe a truncated stream): the frames that
        come out are the first ones sent, unchanged; then a
        L{ProtocolError}, or simply no more frames when truncated before
        the damage.
        """
        data = bytearray(self.stream(frames))
        data[position % len(data)] ^= xor
        if truncate:
            del data[cut % len(data) :]
        decoder = TransferDecoder(checked=True)
        out: list[TransferFrame] = []
        try:
            for chunk in split(bytes(data), [cut % (len(data) + 1)]):
                decoder.feed(chunk)
                drain(decoder, out)
        except ProtocolError:
            pass
        got = [(f.offset, bytes(f.body)) for f in out]
        self.assertEqual(got, frames[: len(got)])
        # The damaged frame (or, truncated, the cut one) never comes out.
        self.assertLess(len(got), len(frames))

    @settings(deadline=None, derandomize=True, max_examples=200)
    @given(offsets=st.lists(OFFSETS, min_size=1, max_size=6), position=st.integers(0, 1000),
           xor=st.integers(1, 255))
    def test_damaged_reports(self, offsets: list[int], position: int, xor: int) -> None:
        """
        A damaged checked report is never returned as an offset.
        """
        data = bytearray(b"".join(encode_report(o, checked=True) for o in offsets))
        data[position % len(data)] ^= xor
        with self.assertRaises(ProtocolError):
            ReportDecoder(checked=True).feed(bytes(data))
