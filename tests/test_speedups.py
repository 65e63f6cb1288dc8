"""
The compiled accelerator (C{rmqha.store._speedups}) against the reference,
the pure-Python codec in L{rmqha.store._record}: the same answers and the
same refusals, word for word, on random valid and hostile input; no read
outside the buffer whatever the lengths say; and the codec tests of
C{tests.test_record} run again here on the pure path, so one run of the
suite exercises both.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import sys
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store import _record
from rmqha.store._record import (
    Message,
    RecordEncoder,
    ReplicaValidator,
    check_record,
    encode_blank,
    walk_headers,
    walk_valid,
)
from tests import test_record
from tests._helpers import PurePath
from tests.test_record import HOSTS, INT64, decoder_inputs, encode, messages

try:
    from rmqha.store import _speedups  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the build tells why
    _speedups = None

EQUAL = settings(
    deadline=None,
    derandomize=True,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def codec(accelerator: Any) -> Iterator[None]:
    """
    Run the body with C{accelerator} (the module, or C{None}: pure Python)
    as the codec's compiled part.
    """
    saved = _record._accel
    _record._accel = accelerator
    try:
        yield
    finally:
        _record._accel = saved


def outcome(call: Callable[[], Any]) -> Any:
    """
    What C{call} returns, or the type and text of what it raises.
    """
    try:
        return ("returned", call())
    except Exception as e:
        return ("raised", type(e).__name__, str(e))


def both(call: Callable[[], Any]) -> tuple[Any, Any]:
    """
    C{outcome(call)} on the pure path, then on the compiled one.
    """
    with codec(None):
        pure = outcome(call)
    with codec(_speedups):
        compiled = outcome(call)
    return pure, compiled


class _Compiled:
    def setUp(self) -> None:
        if _speedups is None:
            raise SkipTest("rmqha.store._speedups is not built (see docs/development.md)")


class BuildTests(SynchronousTestCase):
    """
    The accelerator is there where it can be, and the switch works.
    """

    def test_built_where_a_compiler_is(self) -> None:
        """
        In a checkout set up by C{dev.py} (or C{pip install}) on a machine
        with a C compiler the compiled module is importable and in use:
        a build that silently stopped working would otherwise only show as
        a slower store.
        """
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            raise SkipTest("no C compiler: the pure-Python codec is the one built")
        self.assertIsNotNone(_speedups, "rmqha.store._speedups is not built")
        if os.environ.get("RMQHA_PURE", "0") in ("", "0"):
            self.assertTrue(_record.ACCELERATED)

    def test_version_names_the_codec(self) -> None:
        """
        C{rmqha --version} says which codec is in use.
        """
        from rmqha import cli

        out = io.StringIO()
        self.patch(sys, "stdout", out)
        self.assertEqual(cli.main(["--version"]), 0)
        expected = "compiled" if _record.ACCELERATED else "pure Python"
        self.assertIn(f"(codec: {expected})", out.getvalue())

    def test_pure_switch(self) -> None:
        """
        C{RMQHA_PURE=1} in the environment leaves the compiled module unused.
        """
        saved = os.environ.get("RMQHA_PURE")
        os.environ["RMQHA_PURE"] = "1"
        try:
            self.assertIsNone(_record._load_accelerator())
            os.environ["RMQHA_PURE"] = "0"
            self.assertIs(_record._load_accelerator(), _speedups)
        finally:
            if saved is None:
                del os.environ["RMQHA_PURE"]
            else:
                os.environ["RMQHA_PURE"] = saved


def _folding_in_cpu(*needed: str) -> bool | None:
    """
    Whether C{/proc/cpuinfo} lists PCLMULQDQ, SSE4.1 and C{needed} for
    every CPU (C{None}: no such file).
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = [line.split(":", 1)[1].split() for line in f if line.startswith("flags")]
    except OSError:
        return None
    wanted = ("pclmulqdq", "sse4_1", *needed)
    return bool(flags) and all(all(w in f for w in wanted) for f in flags)


class CRC32Tests(_Compiled, SynchronousTestCase):
    """
    C{_speedups.crc32} (the CRC-32 of every body CRC and of checked framing)
    gives exactly C{zlib.crc32}'s results, on the 512-bit VPCLMULQDQ folding
    path, the 128-bit PCLMULQDQ one and the zlib fallback, for every length,
    alignment and starting value.
    """

    def setUp(self) -> None:
        super().setUp()
        # The import-time settings: folding, as wide as the CPU has it.
        self.addCleanup(_speedups._crc32_set_wide, True)
        self.addCleanup(_speedups._crc32_set_folding, True)

    def both_paths(self) -> Iterator[str]:
        """
        Run the loop body with wide folding (where the CPU has it), with
        128-bit folding (where it has that), then with zlib alone.
        """
        for path, folding, wide in (("wide", True, True), ("narrow", True, False),
                                    ("zlib", False, False)):
            _speedups._crc32_set_folding(folding)
            _speedups._crc32_set_wide(wide)
            yield path

    def test_folding_where_the_cpu_has_it(self) -> None:
        """
        The fast path is the one in use on a CPU with PCLMULQDQ and SSE4.1
        (otherwise every other test here would prove only the fallback), and
        it can be turned off.
        """
        self.assertFalse(_speedups._crc32_set_folding(False))
        expected = _folding_in_cpu()
        if expected is None:
            raise SkipTest("no /proc/cpuinfo to say what the CPU has")
        self.assertEqual(_speedups._crc32_set_folding(True), expected)

    def test_wide_folding_where_the_cpu_has_it(self) -> None:
        """
        The 256-bytes-a-step path is the one in use on a CPU with AVX-512F
        and VPCLMULQDQ, and it can be turned off; folding itself off, the
        wide path is not taken either (the zlib-only path tested above).
        """
        self.assertFalse(_speedups._crc32_set_wide(False))
        expected = _folding_in_cpu("avx512f", "vpclmulqdq")
        if expected is None:
            raise SkipTest("no /proc/cpuinfo to say what the CPU has")
        self.assertEqual(_speedups._crc32_set_wide(True), expected)

    @EQUAL
    @given(
        st.binary(max_size=5200),
        st.integers(0, 31),
        st.integers(0, 2**32 - 1),
    )
    def test_random(self, data: bytes, start: int, value: int) -> None:
        """
        Random bytes of any length up to ~5 KB, from any offset into the
        buffer (an unaligned memoryview slice), any starting value.
        """
        view = memoryview(data)[min(start, len(data)) :]
        expected = zlib.crc32(view, value)
        for folding in self.both_paths():
            self.assertEqual(_speedups.crc32(view, value), expected, (folding, len(view)))

    def test_every_length(self) -> None:
        """
        Every length 0..5000, at several misalignments: each tail length
        after the 16-byte folding steps, each count of 64-byte blocks.
        """
        data = bytes(range(256)) * 20 + bytes(reversed(range(256))) * 2
        for start in (0, 1, 7, 13):
            for length in range(5001):
                view = memoryview(data)[start : start + length]
                expected = zlib.crc32(view)
                for folding in self.both_paths():
                    self.assertEqual(_speedups.crc32(view), expected, (folding, start, length))

    @EQUAL
    @given(st.binary(max_size=3000), st.binary(max_size=3000), st.integers(0, 2**32 - 1))
    def test_chained(self, first: bytes, second: bytes, value: int) -> None:
        """
        A CRC continued with C{value}, as zlib's is: two pieces give the
        CRC of the whole.
        """
        for folding in self.both_paths():
            self.assertEqual(
                _speedups.crc32(second, _speedups.crc32(first, value)),
                zlib.crc32(first + second, value),
                folding,
            )

    def test_large(self) -> None:
        """
        A few MiB (checksummed with the GIL released), from a bytearray, at
        an odd offset: the same results.
        """
        data = bytearray(os.urandom(3 * 1024 * 1024 + 13))
        view = memoryview(data)[5:]
        expected = zlib.crc32(view, 12345)
        for folding in self.both_paths():
            self.assertEqual(_speedups.crc32(view, 12345), expected, folding)
            self.assertEqual(_speedups.crc32(data), zlib.crc32(data), folding)

    def test_arguments_as_zlib(self) -> None:
        """
        Starting values are masked to 32 bits, and wrong calls are refused
        in zlib.crc32's words.
        """
        for args in [
            (b"abc", -1),
            (b"abc", 2**40 + 5),
            (bytearray(b"xyz"),),
            (b"",),
            (memoryview(b"abcd")[::2],),
            ("abc",),
            (b"a", 1.5),
            (b"a", 1, 2),
            (),
        ]:
            self.assertEqual(
                outcome(lambda: _speedups.crc32(*args)),
                outcome(lambda: zlib.crc32(*args)),
                args,
            )

    def test_record_crc_on_both_paths(self) -> None:
        """
        The compiled codec's body CRC (encode, the replica check) is the
        same on the fallback path, and is RocketMQ's: zlib.crc32 & 0x7fffffff.
        """
        message = test_record.sample_message(body=os.urandom(3001))
        records = []
        for folding in self.both_paths():
            with codec(_speedups):
                record = encode(message)
            # The compiled check itself accepts it (not the Python fallback).
            self.assertTrue(
                _speedups.check_record(
                    record, 0, test_record.PHYSICAL_OFFSET, len(record), _record.MESSAGE_MAGIC_V1
                ),
                folding,
            )
            records.append(record)
            (stored,) = struct.unpack_from(">i", record, 8)
            self.assertEqual(stored, zlib.crc32(message.body) & 0x7FFFFFFF)
        self.assertEqual(records[0], records[1])

    def test_one_crc_function(self) -> None:
        """
        The Python hot paths (the codec, checked framing) use the one CRC
        function, the compiled one when the accelerator is in use.
        """
        from rmqha.ha import _wire

        self.assertIs(_record.crc32, _speedups.crc32 if _record.ACCELERATED else zlib.crc32)
        self.assertIs(_wire.crc32, _record.crc32)


def _hostile_message(draw: st.DrawFn) -> Message:
    """
    A message from C{messages()}, often with one field made hostile: bad
    topics, separators or surrogates in properties, out-of-range or
    non-int integers, odd born hosts, a bytearray body.
    """
    message: Message = draw(messages(max_body=300, max_properties=4))
    change = draw(st.integers(0, 14))
    if change == 0:
        message.topic = draw(st.sampled_from(["", "a b", "x" * 128, "é", "T\x00"]))
    elif change == 1:
        message.properties = {draw(st.sampled_from(["", "a\x01", "b\x02", "\ud800"])): "v"}
    elif change == 2:
        message.properties = {"k": draw(st.sampled_from(["\x01", "\x02", "\udfff", ""]))}
    elif change == 3:
        message.queue_id = draw(st.sampled_from([2**31, -(2**31) - 1, True, 1.0, None]))
    elif change == 4:
        message.prepared_tx_offset = draw(st.sampled_from([2**63, -(2**63) - 1, False]))
    elif change == 5:
        message.born_timestamp = draw(st.sampled_from([2**63, 1.5, True]))
    elif change == 6:
        message.born_host = draw(
            st.sampled_from(
                [("127.0.0.1", 1.0), ("127.0.0.1", True), ["127.0.0.1", 5], ("nope", 1),
                 ("::ffff:10.0.0.1", 80), ("127.0.0.1", 70000), ("127.0.0.1",), 7]
            )
        )
    elif change == 7:
        message.body = bytearray(message.body)
    elif change == 8:
        message.properties = {"k" * 20000: "v" * 20000}
    elif change == 9:
        message.sysflag = draw(st.sampled_from([2**31, -1, 0x30, True]))
    elif change == 10:
        message.body = b"x" * 5000  # over the encoder's max_message_size below
    return message


hostile_messages = st.composite(_hostile_message)


class EqualityTests(_Compiled, SynchronousTestCase):
    """
    The compiled functions give the pure ones' results and refusals.
    """

    @EQUAL
    @given(inputs=decoder_inputs(), checks=st.tuples(st.booleans(), st.booleans()))
    def test_walk_valid(self, inputs: tuple[bytes, int, int, int], checks: tuple[bool, bool]) -> None:
        """
        L{walk_valid} stops at the same place after the same records, over
        valid, mutated and random bytes, with and without the CRC and the
        strict checks, a second copy of the record after the first.
        """
        buf, pos, end, offset = inputs
        check_crc, strict = checks
        doubled = buf[:end] + buf[pos:end] + buf[end:]
        for data, stop in ((buf, end), (doubled, end + end - pos), (buf, len(buf) + 50)):
            pure, compiled = both(
                lambda: walk_valid(data, pos, stop, offset, check_crc=check_crc, strict=strict)
            )
            self.assertEqual(pure, compiled)

    @EQUAL
    @given(
        inputs=decoder_inputs(),
        cuts=st.lists(st.integers(0, 400), max_size=6),
        size=st.sampled_from([2**40, 400, 200]),
    )
    def test_replica_hop_pieces(
        self, inputs: tuple[bytes, int, int, int], cuts: list[int], size: int
    ) -> None:
        """
        C{replica_hop_pieces} over the bytes cut into pieces anywhere (empty
        ones too) reaches where C{replica_hop} reaches over them joined:
        two copies of the record, valid, mutated or random, the second cut
        across pieces.
        """
        buf, pos, end, offset = inputs
        data = buf[pos:end] * 2
        bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
        pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
        # (Records claim offset `offset`: the chunk starts there.)
        for max_offset in (offset + len(data), offset + len(data) - 1, 2**62):
            self.assertEqual(
                _speedups.replica_hop_pieces(pieces, offset, offset, max_offset, size),
                _speedups.replica_hop(data, offset, offset, max_offset, size),
            )

    @EQUAL
    @given(inputs=decoder_inputs(), size=st.integers(-5, 400))
    def test_walk_headers(self, inputs: tuple[bytes, int, int, int], size: int) -> None:
        """
        L{walk_headers} finds the same record starts and stops at the same
        place, for any segment size.
        """
        buf, pos, end, offset = inputs
        self.assertEqual(*both(lambda: walk_headers(buf, pos, size)))
        self.assertEqual(*both(lambda: walk_headers(buf, pos, len(buf))))

    @EQUAL
    @given(inputs=decoder_inputs(), shift=st.sampled_from([0, 0, 1, -1, 2**40]))
    def test_check_record(self, inputs: tuple[bytes, int, int, int], shift: int) -> None:
        """
        L{check_record} gives the same answer (C{None} or the same reason)
        on a header that passed L{check_header}; and the compiled check
        accepts whatever the pure one accepts, so the fast path is taken.
        """
        buf, pos, end, offset = inputs
        if len(buf) - pos < 8:
            return
        total, magic = _record.read_header(buf, pos)
        if _record.check_header(total, magic, 0, len(buf) - pos) is not None:
            return
        if magic == _record.BLANK_MAGIC:
            return
        pure, compiled = both(lambda: check_record(buf, pos, offset + shift, total, magic))
        self.assertEqual(pure, compiled)
        self.assertEqual(
            _speedups.check_record(buf, pos, offset + shift, total, magic),
            pure == ("returned", None),
        )

    @EQUAL
    @given(
        message=hostile_messages(),
        store_host=HOSTS,
        place=st.tuples(INT64 | st.sampled_from([2**63]), st.integers(0, 2**62), INT64),
        room=st.sampled_from([-1, 0, 100, 600, 0x20000]),
        buf_kind=st.sampled_from(["bytearray", "short", "bytes", "none"]),
    )
    def test_encode(
        self,
        message: Message,
        store_host: tuple[str, int],
        place: tuple[int, int, int],
        room: int,
        buf_kind: str,
    ) -> None:
        """
        L{RecordEncoder.encode} returns the same size, writes the same
        bytes (nothing when the record does not fit) and refuses with the
        same error, on valid and hostile messages; twice, the second time
        with the topic and born host the encoder has remembered.
        """
        queue_offset, physical_offset, store_timestamp = place

        def run(encoder: RecordEncoder) -> Any:
            size = {"short": 50}.get(buf_kind, 0x20000)
            buf = None if buf_kind == "none" else bytearray(b"\xaa" * size)
            target = bytes(buf) if buf_kind == "bytes" and buf is not None else buf
            result = outcome(
                lambda: encoder.encode(
                    target, 3, room, message, queue_offset, physical_offset, store_timestamp
                )
            )
            return result, None if buf is None else bytes(buf)

        results = []
        for accelerator in (None, _speedups):
            with codec(accelerator):
                encoder = RecordEncoder(store_host, max_message_size=4096)
                results.append((run(encoder), run(encoder)))
        self.assertEqual(results[0], results[1])

    @EQUAL
    @given(
        sizes=st.lists(st.integers(0, 200), min_size=1, max_size=12),
        damage=st.lists(
            st.tuples(st.integers(0, 10**6), st.integers(0, 255) | st.sampled_from([-1, -2])),
            max_size=2,
        ),
        cut=st.integers(1, 700),
        missing=st.integers(0, 30),
    )
    def test_replica_advance(
        self, sizes: list[int], damage: list[tuple[int, int]], cut: int, missing: int
    ) -> None:
        """
        L{ReplicaValidator.advance} over a log fed in chunks of any size
        (records cut across chunks, BLANK fillers, damaged bytes or hostile
        int32 lengths, the tail not yet arrived) gives the same record end
        after every chunk and the same L{RecordError} (offset and reason).
        """
        segment = 1024
        log = bytearray()
        for n, size in enumerate(sizes):
            record = encode(
                test_record.sample_message(body=bytes([n]) * size, born_host=None),
                physical_offset=len(log),
            )
            room = segment - len(log) % segment
            if len(record) + 8 > room:
                log += encode_blank(room) + bytes(room - 8)
            log += record
        for at, value in damage:
            at %= len(log)
            if value < 0:  # a hostile int32 somewhere
                log[at : at + 4] = struct.pack(">i", -(2**31) if value == -1 else 2**31 - 1)[
                    : len(log) - at
                ]
            else:
                log[at] = value
        data = bytes(log[: max(len(log) - missing, 0)])

        def feed() -> list[int]:
            validator = ReplicaValidator(segment, lambda o, n: data[o : o + n])
            end, ends = 0, []
            for at in range(0, len(data), cut):
                chunk = memoryview(data)[at : at + cut]
                end = validator.advance(end, at + len(chunk), at, chunk)
                ends.append(end)
            return ends

        self.assertEqual(*both(feed))


def raw_properties() -> st.SearchStrategy[bytes]:
    """
    Property bytes as a record may hold them: pairs (a name twice, empty
    or separator-laden values, non-ASCII), chunks that are not pairs.
    """
    names = st.sampled_from([b"TAGS", b"KEYS", b"k", b"ab", b"", "\u00e9".encode()])
    values = st.sampled_from([b"v", b"", b"x\x01y", b"TagA", b"\xff"])
    pair = st.tuples(names, values).map(b"\x01".join) | st.sampled_from([b"ab", b"\x01ab", b"a\x01"])
    return st.lists(pair, max_size=5).map(b"\x02".join)


@st.composite
def span_logs(draw: st.DrawFn) -> bytes:
    """
    A run of records at their offsets: put-path records (IPv4 and IPv6
    hosts, any text) and handmade ones (raw topic and property bytes:
    non-ASCII, odd chunks, a name twice, zero bytes), sometimes damaged,
    a BLANK or a v2 record among them, zeros or a torn record after.
    """
    log = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["message", "message", "raw", "v2", "blank"]))
        if kind == "message":
            record = encode(draw(messages(max_body=200, max_properties=4)),
                            draw(HOSTS), physical_offset=len(log))
        elif kind == "blank":
            record = encode_blank(draw(st.integers(8, 40)))
        else:
            record = test_record.handmade(
                body=draw(st.binary(max_size=50)),
                topic=draw(
                    st.sampled_from([b"TopicTest", b"t", "\u00e9".encode()])
                    | st.binary(max_size=12).filter(lambda t: t[-1:] != b"\0")
                ),
                properties=draw(raw_properties()),
                physical_offset=len(log),
                magic=test_record.V2 if kind == "v2" else test_record.V1,
            )
        log += record
    for _ in range(draw(st.integers(0, 2))):
        if log and draw(st.booleans()):
            log[draw(st.integers(0, len(log) - 1))] = draw(st.integers(0, 255))
    tail = draw(st.sampled_from([b"", bytes(16), b"\0\0\0\x7f\xda\xa3\x20\xa7"]))
    return bytes(log + tail)


class SpanDecodeTests(_Compiled, SynchronousTestCase):
    """
    The pipeline's reader (L{rmqha.pipeline.scan.read_span}) builds the
    same Arrow rows, and stops or refuses the same way, through the
    compiled column decoder as through the Python loop.
    """

    def setUp(self) -> None:
        super().setUp()
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise SkipTest("pyarrow is not installed")

    @settings(
        deadline=None,
        derandomize=True,
        max_examples=150,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        log=span_logs(),
        bodies=st.booleans(),
        exact=st.booleans(),
        batch_rows=st.sampled_from([1, 2, 8192]),
        topics=st.none() | st.just(["TopicTest"]),
        block=st.sampled_from([16, 150, 400, 4 << 20]),
    )
    def test_same_rows(
        self,
        log: bytes,
        bodies: bool,
        exact: bool,
        batch_rows: int,
        topics: list[str] | None,
        block: int,
    ) -> None:
        """
        Same rows (every column, nulls included) or the same error, for
        valid, plain, unusual and damaged records, bodies on and off, any
        batch size, whatever size of blocks the compiled path reads in
        (records cut by a block's end, records larger than a block).
        """
        import pyarrow as pa

        from rmqha.pipeline import scan
        from rmqha.pipeline.stores import resolve

        if not log:
            return
        path = self.mktemp()
        os.makedirs(os.path.join(path, "commitlog"))
        with open(os.path.join(path, "commitlog", "%020d" % 0), "wb") as f:
            f.write(log)
        store = resolve(path)
        (segment,) = store.segments()
        span = scan.Span(store, segment, 0, len(log), exact)

        def rows() -> Any:
            batches = list(scan.read_span(span, bodies, topics, batch_rows))
            self.assertTrue(all(b.num_rows <= batch_rows for b in batches))
            return pa.Table.from_batches(batches, scan.arrow_schema()).to_pylist()

        saved = scan._READ_BLOCK
        scan._READ_BLOCK = block
        try:
            self.assertEqual(*both(rows))
        finally:
            scan._READ_BLOCK = saved

    def test_property_chunks(self) -> None:
        """
        Records whose property bytes RocketMQ's reader treats specially (a
        name twice: the last value wins; a value holding \x01; chunks too
        short or without a name) give the same rows on both paths.
        """
        import pyarrow as pa

        from rmqha.pipeline import scan
        from rmqha.pipeline.stores import resolve

        log = b""
        for properties in (
            b"TAGS\x01a\x02TAGS\x01b", b"KEYS\x01x\x01y\x02ab\x02\x01ab\x02a\x01",
            b"k\x01v\x02TAGS\x01", b"\x02\x02TAGS\x01t", b"",
        ):
            log += test_record.handmade(properties=properties, physical_offset=len(log))
        path = self.mktemp()
        os.makedirs(os.path.join(path, "commitlog"))
        with open(os.path.join(path, "commitlog", "%020d" % 0), "wb") as f:
            f.write(log)
        store = resolve(path)
        (segment,) = store.segments()
        span = scan.Span(store, segment, 0, len(log), True)
        pure, compiled = both(
            lambda: pa.Table.from_batches(list(scan.read_span(span))).to_pylist()
        )
        self.assertEqual(pure, compiled)
        self.assertEqual(pure[1][0]["properties"], [("TAGS", "b")])


class SpanDecodeMemoryTests(_Compiled, SynchronousTestCase):
    """
    The column decoder's memory: each column is written once, into memory
    that Arrow then reads as it is (pyarrow's reader with bodies on ran at
    half speed when the body column was grown by doubling and then copied
    into a bytes object: docs/benchmarks.md "Where the time goes: reading").
    """

    def test_bodies_held_once(self) -> None:
        """
        Decoding 2 MiB of bodies needs about 2 MiB at its peak, not twice
        or three times that (a buffer grown by doubling, then copied); and
        a batch that keeps few rows of many bytes keeps no more than its
        rows (what was reserved for the rest is given back).
        """
        import tracemalloc

        body = bytes(range(256)) * 16
        one = len(test_record.handmade(body=body))
        log = b"".join(
            test_record.handmade(body=body, physical_offset=i * one) for i in range(512)
        )
        bodies = 512 * len(body)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            stop, rows, buffers = _speedups.decode_span(log, 0, len(log), 0, True, 1 << 20)
            held, peak = tracemalloc.get_traced_memory()
            self.assertEqual((stop, rows), (len(log), 512))
            self.assertEqual(bytes(buffers[-1]), body * 512)
            self.assertLess(peak - before, bodies * 1.25)
            del buffers
            before = tracemalloc.get_traced_memory()[0]
            stop, rows, buffers = _speedups.decode_span(log, 0, len(log), 0, True, 1)
            self.assertEqual((stop, rows), (one, 1))
            self.assertLess(tracemalloc.get_traced_memory()[0] - before, 64 * 1024)
            self.assertEqual(bytes(buffers[-1]), body)
        finally:
            tracemalloc.stop()


class BoundsTests(_Compiled, SynchronousTestCase):
    """
    No compiled function reads or writes outside its buffer, whatever the
    arguments and the lengths in the bytes say.
    """

    def test_hostile_lengths(self) -> None:
        """
        Huge, negative and just-too-big positions, sizes and lengths are
        answered (no record here) without touching bytes past the buffer.
        """
        record = encode(test_record.sample_message(), physical_offset=0)
        total, magic = _record.read_header(record)
        for buf in (record, record[:-1], b"", record[:8]):
            for at in (-1, 0, 1, len(buf), 2**62, -(2**62)):
                whole = at == 0 and buf == record
                for size in (total, -1, 0, 2**31 - 1, 2**62, len(buf) - at + 1):
                    self.assertEqual(
                        _speedups.check_record(buf, at, 0, size, magic),
                        whole and size == total,
                    )
                self.assertEqual(
                    _speedups.walk_valid(buf, at, 2**62, 0, True, True),
                    (total, 1, 0) if whole else (at, 0, -1),
                )
                self.assertLessEqual(len(_speedups.walk_headers(buf, at, 2**62)[0]), 1)
                self.assertEqual(
                    _speedups.replica_hop(buf, at, 0, 2**62, 2**40), total if whole else 0
                )
        self.assertTrue(_speedups.check_record(record, 0, 0, total, magic))
        big = bytearray(record)
        for field in (0, 84, 84 + 4 + 14):  # TOTALSIZE, BODYLENGTH, topic length
            for value in (2**31 - 1, -(2**31), -1):
                forged = bytearray(big)
                struct.pack_into(">i", forged, field, value)
                # (check_record is given TOTALSIZE, as the header hop read it.)
                self.assertEqual(
                    _speedups.check_record(bytes(forged), 0, 0, total, magic), field == 0
                )
                self.assertEqual(_speedups.walk_valid(bytes(forged), 0, len(forged), 0, True, True),
                                 (0, 0, -1))

    def test_replica_hop_pieces_arguments(self) -> None:
        """
        C{replica_hop_pieces} takes any sequence of buffers (none: it stays
        where it is) and refuses anything else with a C{TypeError},
        releasing the buffers it had taken.
        """
        record = encode(test_record.sample_message(), physical_offset=0)
        total = len(record)
        self.assertEqual(_speedups.replica_hop_pieces([], 0, 0, 2**62, 2**40), 0)
        for pieces in ([record], (record[:3], memoryview(record)[3:]),
                       [bytearray(record[:100]), b"", record[100:]]):
            self.assertEqual(_speedups.replica_hop_pieces(pieces, 0, 0, 2**62, 2**40), total)
        held = bytearray(record)
        for bad in ([held, "text"], [held, 3], 5, None):
            with self.assertRaises(TypeError):
                _speedups.replica_hop_pieces(bad, 0, 0, 2**62, 2**40)
        held.append(0)  # (no buffer export left behind)

    def test_encode_outside_the_buffer(self) -> None:
        """
        The compiled encoder writes nothing when the record would not lie
        inside the buffer (a position past it, a negative one): the Python
        code decides, as before.
        """
        encoder = RecordEncoder(("10.0.0.1", 10911))
        message = test_record.sample_message()
        encoder.encode(None, 0, -1, message, 0, 0, 0)  # remember the topic
        for pos in (-1, 10, 2**40):
            buf = bytearray(64)
            self.assertIsNone(_speedups.encode(encoder, buf, pos, 10**6, message, 0, 0, 0))
            self.assertEqual(buf, bytearray(64))


class MutatingMessageTests(_Compiled, SynchronousTestCase):
    """
    A message whose attribute reads run code that empties the encoder's
    caches and the message's own properties (a property on a subclass)
    cannot make the compiled encoder use freed memory.
    """

    def test_caches_and_properties_emptied_while_encoding(self) -> None:
        """
        Reading C{sysflag} clears the topic and host caches and the
        properties dict; the compiled encoder, which reads every attribute
        before looking anything up, writes a record the decoder accepts.
        """
        encoder = RecordEncoder(("10.0.0.1", 10911))

        class Mutating(Message):
            @property  # type: ignore[override]
            def sysflag(self) -> int:
                encoder._topics.clear()
                encoder._hosts.clear()
                self.properties.clear()
                return 0

            @sysflag.setter
            def sysflag(self, value: int) -> None:
                pass

        for _ in range(3):  # the second and third time, the caches are warm
            buf = bytearray(4096)
            message = Mutating(
                "TopicTest", b"body" * 100,
                # Built at run time: the dict holds the only references.
                properties={"".join(["TA", "GS"]): "".join(["a"] * 50), "KEYS": "b" * (len(buf) // 64)},
                born_host=(".".join(["192", "168", "1", "2"]), 40000),
            )
            total = encoder.encode(buf, 0, len(buf), message, 0, 0, 1)
            record = _record.parse_record(bytes(buf), 0, total, 0)
            self.assertEqual(record.topic, "TopicTest")
            self.assertEqual(record.born_host, ("192.168.1.2", 40000))


class PutLoopTests(_Compiled, SynchronousTestCase):
    """
    The compiled put loop (C{_speedups.put_batch}, behind L{CommitLog.put}
    and L{CommitLog.put_batch}): the same log, results, refusals and queue
    offsets as the Python loop, and it is the path the common put takes.
    """

    def _store(self) -> str:
        path = self.mktemp()
        os.makedirs(path)
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @settings(EQUAL, max_examples=120)
    @given(
        batches=st.lists(st.lists(hostile_messages(), min_size=1, max_size=5), min_size=1, max_size=6),
        singles=st.lists(st.booleans(), min_size=6, max_size=6),
    )
    def test_same_log(self, batches: list[list[Message]], singles: list[bool]) -> None:
        """
        Batches (some put one message at a time with L{CommitLog.put}) of
        valid and hostile messages into 4 KiB segments (so batches roll and
        get refused for not fitting) give the same answers, the same bytes
        on disk and the same queue table on the pure and the compiled path;
        every result is an L{AppendResult}.
        """
        from rmqha.store.commitlog import AppendResult, CommitLog

        def run() -> Any:
            answers = []
            with CommitLog.open(
                self._store(), segment_size=4096, max_message_size=4096, clock=lambda: 1.5
            ) as log:
                for batch, single in zip(batches, singles):
                    if single:
                        for message in batch:
                            answers.append(outcome(lambda: log.put(message)))
                    else:
                        answers.append(outcome(lambda: log.put_batch(batch)))
                for answer in answers:
                    if answer[0] == "returned":
                        for result in (answer[1] if isinstance(answer[1], list) else [answer[1]]):
                            self.assertIs(type(result), AppendResult)
                data = b"".join(
                    log.read(offset, 4096) for offset in range(0, log.max_offset, 4096)
                )
                return answers, data, dict(log._queues.table or {})

        with codec(None):
            pure = run()
        with codec(_speedups):
            compiled = run()
        self.assertEqual(pure, compiled)

    def test_one_call_per_put(self) -> None:
        """
        Once the encoder has seen a message's topic, neither a single put
        nor a batch of 32 calls the Python C{RecordEncoder.encode}: the
        compiled loop does the queue offsets, the encoding and the results
        in one call.
        """
        from rmqha.store.commitlog import CommitLog

        with codec(_speedups), CommitLog.open(self._store(), segment_size=1 << 20) as log:
            messages = [
                Message("LoopTopic", b"b" * 100, queue_id=i % 4, properties={"TAGS": "a"})
                for i in range(33)
            ]
            log.put(messages[0])  # the topic is remembered here
            calls = []
            encode = log._encoder.encode

            def counting(*args: Any) -> int:
                calls.append(args)
                return encode(*args)

            log._encoder.encode = counting  # type: ignore[method-assign]
            results = log.put_batch(messages[1:])
            single = log.put(messages[0])
            self.assertEqual(calls, [])
            self.assertEqual([r.queue_offset for r in results[:8]], [0, 0, 0, 1, 1, 1, 1, 2])
            self.assertEqual(single.queue_offset, 9)
            self.assertEqual(single.offset, results[-1].offset + results[-1].size)

    def test_error_mid_batch_leaves_nothing(self) -> None:
        """
        A message whose attribute read raises, third in a batch, fails the
        whole batch on both paths: the exception comes out, the two records
        written before it are zeroed, the queue offsets are as they were.
        """
        from rmqha.store.commitlog import CommitLog

        class Raising(Message):
            @property  # type: ignore[override]
            def sysflag(self) -> int:
                raise ZeroDivisionError("no sysflag")

            @sysflag.setter
            def sysflag(self, value: int) -> None:
                pass

        for accelerator in (None, _speedups):
            with codec(accelerator), CommitLog.open(self._store(), segment_size=1 << 16) as log:
                first = log.put(Message("LoopTopic", b"x"))
                batch = [Message("LoopTopic", b"y" * 100)] * 2 + [Raising("LoopTopic", b"z")]
                self.assertRaises(ZeroDivisionError, log.put_batch, batch)
                self.assertRaises(ZeroDivisionError, log.put, batch[2])
                self.assertEqual(log.max_offset, first.size)
                self.assertEqual(bytes(log._segments[-1].mm[first.size:]), bytes((1 << 16) - first.size))
                self.assertEqual(log.put(batch[0]).queue_offset, 1)

    def test_messages_shrinking_while_put(self) -> None:
        """
        A message whose C{sysflag} read empties the list being put cannot
        make the compiled loop read past the list: like the Python loop,
        the batch ends with the list (one record here).
        """
        from rmqha.store.commitlog import CommitLog

        batch: list[Message] = []

        class Emptying(Message):
            @property  # type: ignore[override]
            def sysflag(self) -> int:
                batch.clear()
                return 0

            @sysflag.setter
            def sysflag(self, value: int) -> None:
                pass

        with codec(_speedups), CommitLog.open(self._store(), segment_size=1 << 20) as log:
            log.put(Message("LoopTopic", b"x"))
            batch.extend([Emptying("LoopTopic", b"y" * 50)] + [Message("LoopTopic", b"z")] * 5)
            results = log.put_batch(batch)
            self.assertEqual([r.size for r in results], [results[0].size])
            self.assertEqual(log.max_offset, results[0].offset + results[0].size)


# The codec tests of tests/test_record.py again, on the pure-Python path
# (the default run takes the compiled one where it is built).


class PureEncodeRecordTests(PurePath, test_record.EncodeRecordTests):
    """L{test_record.EncodeRecordTests} on the pure-Python path."""


class PureEncoderRejectionTests(PurePath, test_record.EncoderRejectionTests):
    """L{test_record.EncoderRejectionTests} on the pure-Python path."""


class PureRoundTripTests(PurePath, test_record.RoundTripTests):
    """L{test_record.RoundTripTests} on the pure-Python path."""


class PureReplicaCheckTests(PurePath, test_record.ReplicaCheckTests):
    """L{test_record.ReplicaCheckTests} on the pure-Python path."""


class PureReplicaValidatorTests(PurePath, test_record.ReplicaValidatorTests):
    """L{test_record.ReplicaValidatorTests} on the pure-Python path."""
