"""
Tests for the admin HTTP's read-only commit log (C{--serve-commitlog}):
L{rmqha.admin.commitlog}, the serving machinery and the C{/commitlog}
resources of
L{rmqha.admin}, over the real admin C{Site} on a L{StringTransport} with
a L{Clock} (no sockets, no real time).
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from rmqha.admin.commitlog import (
    CHUNK_SIZE,
    MAX_STREAMS,
    ByteRange,
    RangeNotSatisfiable,
    TokenBucket,
    parse_range,
)
from rmqha.admin import AdminService, make_site
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.tap import Options, makeService
from rmqha.tls import commitlog_exposure_warning

from tests._helpers import fixed_clock
from tests.test_admin import response

SEGMENT = 1024 * 1024
FIRST = b"%020d" % 0


class RangeTests(SynchronousTestCase):
    """
    L{parse_range}: one byte range of a file, or a one-line refusal.
    """

    def test_forms(self) -> None:
        """
        C{a-b} (inclusive, cut at the end), C{a-}, the suffix C{-n} (the
        whole file when longer), and no header (the whole file).
        """
        self.assertIsNone(parse_range(None, 100))
        self.assertEqual(parse_range(b"bytes=10-19", 100), ByteRange(10, 20))
        self.assertEqual(parse_range(b"bytes=10-1000", 100), ByteRange(10, 100))
        self.assertEqual(parse_range(b"bytes=99-", 100), ByteRange(99, 100))
        self.assertEqual(parse_range(b"bytes=-10", 100), ByteRange(90, 100))
        self.assertEqual(parse_range(b"bytes=-1000", 100), ByteRange(0, 100))
        self.assertEqual(parse_range(b"Bytes = 0 - 0", 100), ByteRange(0, 1))

    def test_refused(self) -> None:
        """
        Several ranges, malformed headers, a start at or past the end, a
        last byte before the first, an empty suffix: each a one-line
        L{RangeNotSatisfiable} showing the header.
        """
        for header in [
            b"bytes=0-1,5-6",
            b"bytes=100-",
            b"bytes=5-4",
            b"bytes=-0",
            b"bytes=-",
            b"items=0-1",
            b"bytes=a-b",
            b"bytes=99999999999999999999999-",
        ]:
            e = self.assertRaises(RangeNotSatisfiable, parse_range, header, 100)
            self.assertIn(repr(header.decode())[:20], str(e))
            self.assertNotIn("\n", str(e))


class TokenBucketTests(SynchronousTestCase):
    """
    L{TokenBucket}: RATE bytes per second for all callers, in turn.
    """

    def test_pacing_and_order(self) -> None:
        """
        A caller takes at once while the bucket is not in debt; then
        waiters are granted in order as the clock pays the debt, at
        C{rate}; a cancelled wait is never granted and leaves no timer.
        """
        clock = Clock()
        bucket = TokenBucket(100, clock, burst=100)
        self.assertTrue(bucket.try_take(100))
        self.assertFalse(bucket.try_take(1))
        granted: list[str] = []
        bucket.wait(100, lambda: granted.append("a"))
        cancel_b = bucket.wait(100, lambda: granted.append("b"))
        bucket.wait(50, lambda: granted.append("c"))
        self.assertEqual(granted, [])
        clock.advance(0.99)
        self.assertEqual(granted, [])
        clock.advance(0.01)
        self.assertEqual(granted, ["a"])
        cancel_b()
        clock.advance(1)
        self.assertEqual(granted, ["a", "c"])
        clock.advance(10)
        self.assertEqual(clock.getDelayedCalls(), [])
        # Idle time saves up at most the burst (then one more take).
        self.assertTrue(bucket.try_take(100))
        self.assertTrue(bucket.try_take(100))
        self.assertFalse(bucket.try_take(1))


class CommitLogHTTPTests(SynchronousTestCase):
    """
    C{/commitlog} on the admin C{Site}.
    """

    rate = 1 << 30

    def setUp(self) -> None:
        reactor = MemoryReactorClock()
        reactor.advance(1700000000)
        self.store = self.mktemp()
        self.broker_ = Broker(
            BrokerSettings(role=Role.MASTER, ha_listen="tcp:0"),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(self.store, segment_size=SEGMENT, clock=fixed_clock),
        )
        self.broker_.startService()
        self.addCleanup(self.broker_.stopService)
        self.clock = Clock()
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))
        self.site: Any = None

    def put(self, total: int) -> None:
        """
        Put messages of about C{total} bytes.
        """
        for _ in range(max(1, total // 10000)):
            self.broker_.put(Message("Orders", b"m" * 9800))

    def connect(self, rate: int | None = None) -> tuple[Any, StringTransport]:
        if self.site is None:
            self.site = make_site(
                self.broker_,
                reactor=self.clock,
                serve_commitlog=self.rate if rate is None else rate,
            )
        channel = self.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel.makeConnection(transport)
        self.addCleanup(self.close, channel)
        return channel, transport

    def close(self, channel: Any) -> None:
        if channel.transport is not None and not getattr(channel, "_lost", False):
            channel._lost = True
            channel.connectionLost(Failure(ConnectionDone()))

    def get(self, path: bytes, *headers: bytes, method: bytes = b"GET",
            rate: int | None = None) -> tuple[Any, StringTransport]:
        channel, transport = self.connect(rate)
        head = b"".join(h + b"\r\n" for h in headers)
        channel.dataReceived(b"%s %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (method, path, head))
        return channel, transport

    def run_for(self, seconds: float, step: float = 0.125) -> None:
        """
        Let C{seconds} pass on the clock in small steps (as a reactor's
        time passes), running what falls due.
        """
        self.clock.pump([step] * round(seconds / step))

    def file_bytes(self) -> bytes:
        with open(os.path.join(self.store, "commitlog", FIRST.decode()), "rb") as f:
            return f.read()

    def test_off_by_default(self) -> None:
        """
        Without C{serve_commitlog}, C{/commitlog} and a segment under it
        are 404 JSON saying how to serve it.
        """
        for path in (b"/commitlog", b"/commitlog/" + FIRST):
            self.put(1000)
            self.site = make_site(self.broker_, reactor=self.clock)
            _, transport = self.get(path)
            code, headers, body = response(transport)
            self.assertEqual(code, 404)
            self.assertEqual(headers["content-type"], "application/json")
            self.assertIn("--serve-commitlog RATE", json.loads(body)["error"])

    def test_listing(self) -> None:
        """
        C{GET /commitlog}: role, segment size, min and max offset (where
        whole records end), and each segment's name, offset and size.
        """
        self.put(SEGMENT + 100000)
        _, transport = self.get(b"/commitlog")
        code, _, body = response(transport)
        self.assertEqual(code, 200)
        answer = json.loads(body)
        log = self.broker_.commitlog
        self.assertEqual(answer["status"], "OK")
        self.assertEqual(answer["role"], "ASYNC_MASTER")
        self.assertEqual(answer["segment_size"], SEGMENT)
        self.assertEqual((answer["min_offset"], answer["max_offset"]), (0, log.max_offset))
        self.assertEqual(
            answer["segments"],
            [
                {"name": "%020d" % 0, "offset": 0, "size": SEGMENT},
                {"name": "%020d" % SEGMENT, "offset": SEGMENT, "size": SEGMENT},
            ],
        )

    def test_whole_segment_and_ranges(self) -> None:
        """
        No C{Range}: 200 and the whole file; C{bytes=a-b}, C{a-} and a
        suffix: 206 with C{Content-Range}, C{Content-Length},
        C{Accept-Ranges} and C{X-Rmqha-Max-Offset}, bytes as in the file.
        """
        self.put(300000)
        self.broker_.commitlog.flush()
        data = self.file_bytes()
        max_offset = self.broker_.commitlog.max_offset
        _, transport = self.get(b"/commitlog/" + FIRST)
        self.run_for(10)
        code, headers, body = response(transport)
        self.assertEqual((code, len(body)), (200, SEGMENT))
        self.assertEqual(body, data)
        self.assertEqual(headers["x-rmqha-max-offset"], str(max_offset))
        for header, (start, end) in [
            (b"bytes=100-199", (100, 200)),
            (b"bytes=%d-" % (SEGMENT - 10), (SEGMENT - 10, SEGMENT)),
            (b"bytes=-300", (SEGMENT - 300, SEGMENT)),
        ]:
            _, transport = self.get(b"/commitlog/" + FIRST, b"Range: " + header)
            code, headers, body = response(transport)
            self.assertEqual(code, 206, header)
            self.assertEqual(body, data[start:end])
            self.assertEqual(headers["content-range"], f"bytes {start}-{end - 1}/{SEGMENT}")
            self.assertEqual(headers["content-length"], str(end - start))
            self.assertEqual(headers["accept-ranges"], "bytes")
            self.assertEqual(headers["x-rmqha-max-offset"], str(max_offset))

    def test_head(self) -> None:
        """
        C{HEAD}: the headers a C{GET} would have, no body, no stream.
        """
        self.put(1000)
        _, transport = self.get(b"/commitlog/" + FIRST, b"Range: bytes=0-9", method=b"HEAD")
        head, _, rest = transport.value().partition(b"\r\n\r\n")
        self.assertIn(b"206", head.split(b"\r\n")[0])
        self.assertIn(b"Content-Length: 10", head)
        self.assertEqual(rest, b"")

    def test_unsatisfiable(self) -> None:
        """
        A multi-range or a range past the end: 416 JSON (one line) with
        C{Content-Range: bytes */SIZE}.
        """
        self.put(1000)
        for header in (b"Range: bytes=0-1,3-4", b"Range: bytes=%d-" % SEGMENT):
            _, transport = self.get(b"/commitlog/" + FIRST, header)
            code, headers, body = response(transport)
            self.assertEqual(code, 416)
            self.assertEqual(headers["content-range"], f"bytes */{SEGMENT}")
            self.assertEqual(json.loads(body)["status"], "RANGE_NOT_SATISFIABLE")
            self.assertEqual(body.count(b"\n"), 1)

    def test_unknown_names(self) -> None:
        """
        Only a segment the store lists is served: another 20-digit name,
        a traversal, anything below a segment name: 404.
        """
        self.put(1000)
        for path in [
            b"/commitlog/%020d" % SEGMENT,
            b"/commitlog/..%2F..%2Fetc%2Fpasswd",
            b"/commitlog/../lock",
            b"/commitlog/" + FIRST + b"/x",
            b"/commitlog/%2Fetc%2Fpasswd",
        ]:
            _, transport = self.get(path)
            code, _, body = response(transport)
            self.assertEqual(code, 404, path)

    def test_zeros_past_max_offset(self) -> None:
        """
        Bytes at and past the max offset when the request came are sent as
        zeros, even when records were appended there while it streamed.
        """
        self.put(100000)
        seen = self.broker_.commitlog.max_offset
        _, transport = self.get(b"/commitlog/" + FIRST, rate=CHUNK_SIZE)
        self.put(500000)
        self.assertGreater(self.broker_.commitlog.max_offset, CHUNK_SIZE + 100000)
        self.run_for(10)
        code, headers, body = response(transport)
        self.assertEqual(code, 200)
        self.assertEqual(headers["x-rmqha-max-offset"], str(seen))
        self.assertEqual(body[:seen], self.file_bytes()[:seen])
        self.assertEqual(body[seen:], bytes(SEGMENT - seen))

    def test_rate(self) -> None:
        """
        N bytes take N/RATE seconds of the clock, minus the first chunk
        sent at once; two streams share the one rate.
        """
        self.put(1000)
        rate = 4 * CHUNK_SIZE  # a chunk each quarter second
        _, first = self.get(b"/commitlog/" + FIRST, rate=rate)
        _, second = self.get(b"/commitlog/" + FIRST, rate=rate)
        chunks = SEGMENT // CHUNK_SIZE
        self.run_for((2 * chunks - 1) / 4 - 0.125)
        self.assertFalse(
            len(first.value()) > SEGMENT and len(second.value()) > SEGMENT
        )
        self.run_for(0.125)
        self.assertEqual(len(response(first)[2]), SEGMENT)
        self.assertEqual(len(response(second)[2]), SEGMENT)
        self.assertEqual(self.site.resource.children[b"commitlog"]._server.streams, 0)

    def test_paused_transport(self) -> None:
        """
        While the transport's buffer is full (producer paused) nothing more
        is read or written whatever the rate allows; resumed, it goes on.
        """
        self.put(1000)
        channel, transport = self.get(b"/commitlog/" + FIRST)
        sent = len(transport.value())
        self.assertLess(sent, CHUNK_SIZE + 1000)
        transport.producer.pauseProducing()
        self.run_for(10)
        self.assertEqual(len(transport.value()), sent)
        transport.producer.resumeProducing()
        self.run_for(10)
        self.assertEqual(len(response(transport)[2]), SEGMENT)

    def test_low_rate_chunks(self) -> None:
        """
        At a low rate a chunk is a quarter second of it (at least 1 KiB),
        so every busy stream writes often enough to stay inside the idle
        timeout.
        """
        self.put(1000)
        self.get(b"/commitlog/" + FIRST, rate=8000)
        server = self.site.resource.children[b"commitlog"]._server
        self.assertEqual(server.chunk_size, 2000)
        self.assertEqual(server.bytes_served, 2000)
        self.run_for(1)
        self.assertEqual(server.bytes_served, 10000)
        self.assertEqual(
            make_site(self.broker_, serve_commitlog=100).resource.children[b"commitlog"]
            ._server.chunk_size,
            1024,
        )

    def test_client_gone(self) -> None:
        """
        The client going away stops the stream: its bucket wait is
        cancelled (no timer left), the stream no longer counts.
        """
        self.put(1000)
        channel, transport = self.get(b"/commitlog/" + FIRST, rate=1000)
        server = self.site.resource.children[b"commitlog"]._server
        self.assertEqual(server.streams, 1)
        self.close(channel)
        self.assertEqual(server.streams, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        sent = server.bytes_served
        self.run_for(1000, step=10)
        self.assertEqual(server.bytes_served, sent)

    def test_stream_bound(self) -> None:
        """
        At most L{MAX_STREAMS} bodies at once: one more is 503 JSON with
        C{Retry-After}; once one ends, a new one is served.
        """
        self.put(1000)
        channels = [self.get(b"/commitlog/" + FIRST, rate=1000)[0] for _ in range(MAX_STREAMS)]
        _, transport = self.get(b"/commitlog/" + FIRST)
        code, headers, body = response(transport)
        self.assertEqual(code, 503)
        self.assertEqual(headers["retry-after"], "1")
        self.assertEqual(json.loads(body)["status"], "BUSY")
        self.close(channels[0])
        _, transport = self.get(b"/commitlog/" + FIRST, b"Range: bytes=0-9")
        self.run_for(6, step=0.5)
        self.assertEqual(response(transport)[0], 206)

    def test_metrics_and_status(self) -> None:
        """
        C{/metrics} counts the bytes served; C{/status} shows the rate.
        """
        self.put(1000)
        _, transport = self.get(b"/commitlog/" + FIRST, b"Range: bytes=0-99")
        _, transport = self.get(b"/metrics")
        self.assertIn(b"rmqha_http_commitlog_bytes_total 100.0", response(transport)[2])
        _, transport = self.get(b"/status")
        self.assertEqual(json.loads(response(transport)[2])["serve_commitlog"], self.rate)


class OptionTests(SynchronousTestCase):
    """
    C{--serve-commitlog RATE} / C{serveCommitLog}.
    """

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_values(self) -> None:
        """
        Off by default; sizes with suffixes; C{0} and C{off} are off; the
        config-file key is read and the flag overrides it; the admin
        service twistd builds gets the rate.
        """
        base = ("--store-dir", "s", "--http", "tcp:8080:interface=127.0.0.1")
        self.assertEqual(self.parse(*base).settings.serve_commitlog, 0)
        self.assertEqual(
            self.parse(*base, "--serve-commitlog", "64m").settings.serve_commitlog, 64 << 20
        )
        for off in ("0", "off"):
            self.assertEqual(
                self.parse(*base, "--serve-commitlog", off).settings.serve_commitlog, 0
            )
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("storePathRootDir=s\nserveCommitLog=1m\n")
        self.assertEqual(
            self.parse("--config", path, "--http", "8080").settings.serve_commitlog, 1 << 20
        )
        service = makeService(
            self.parse("--store-dir", self.mktemp(), *base[2:], "--serve-commitlog", "2m")
        )
        self.assertEqual(service.getServiceNamed("http").serve_commitlog, 2 << 20)

    def test_bad(self) -> None:
        """
        A bad rate, or serving without C{--http}: a one-line usage error
        naming the flag.
        """
        e = self.assertRaises(
            UsageError, self.parse, "--store-dir", "s", "--http", "8080",
            "--serve-commitlog", "fast",
        )
        self.assertIn("--serve-commitlog: 'fast'", str(e))
        e = self.assertRaises(
            UsageError, self.parse, "--store-dir", "s", "--serve-commitlog", "1m"
        )
        self.assertIn("--serve-commitlog (serveCommitLog) needs --http", str(e))

    def test_exposure_warning(self) -> None:
        """
        Serving the commit log over plain HTTP beyond loopback is warned
        about; loopback and TLS are not.
        """
        self.assertIsNone(commitlog_exposure_warning("tcp:8080:interface=127.0.0.1"))
        self.assertIsNone(commitlog_exposure_warning("ssl:8080"))
        warning = commitlog_exposure_warning("tcp:8080")
        assert warning is not None
        self.assertIn("message body", str(warning))
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        reactor = MemoryReactorClock()
        broker = Broker(
            BrokerSettings(role=Role.MASTER, ha_listen="tcp:0"),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(self.mktemp(), segment_size=SEGMENT, clock=fixed_clock),
        )
        AdminService(broker, "tcp:0", serve_commitlog=1 << 20).listen(lambda _, f: f)
        self.assertTrue(
            any("--serve-commitlog" in formatEvent(e) for e in events), events
        )
