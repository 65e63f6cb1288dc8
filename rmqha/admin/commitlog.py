# -*- test-case-name: tests.test_admin_commitlog -*-
"""
The commit log served read-only over the admin HTTP (C{--serve-commitlog
RATE}; docs/admin.md, "The commit log"): the byte ranges a live-broker
pipeline source reads (L{rmqha.pipeline.httpstore}).

    GET  /commitlog             the segment files and the max offset
    GET  /commitlog/{segment}   a segment's bytes (one Range), paced at
                                RATE for all readers together

    L{parse_range}        a C{Range} header against a file's size (no I/O)
    L{TokenBucket}        RATE bytes per second shared by every stream
    L{CommitLogServer}    what one admin site serves: the bucket, the bound
                          on concurrent streams, the byte counter
    L{SegmentStream}      one response body: a push producer reading a
                          chunk at a time, paced by the bucket
    L{CommitLogResource}  the resources (L{CommitLogOff} when not served)

Bytes at or past the max offset the request saw are sent as zeros: a
reader never sees a record still being written (it stops at zeros, as at
the end of any segment).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable, NamedTuple

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from rmqha.admin.resource import AdminResource, NotFound, error_answer, json_answer
from rmqha.broker import Broker
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import StoreError

__all__ = [
    "ByteRange",
    "RangeNotSatisfiable",
    "parse_range",
    "TokenBucket",
    "CommitLogServer",
    "SegmentStream",
    "CHUNK_SIZE",
    "MAX_STREAMS",
    "RETRY_AFTER",
    "COMMITLOG_NOT_SERVED",
    "CommitLogResource",
    "CommitLogOff",
]

#: The most read and written at once per stream (its memory bound).
CHUNK_SIZE = 256 * 1024
#: Commit-log bodies streamed at once, all clients together; more get 503.
MAX_STREAMS = 4
#: Seconds a client told 503 is asked to wait (C{Retry-After}).
RETRY_AFTER = 1

_RANGE = re.compile(r"\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*\Z", re.IGNORECASE)


class ByteRange(NamedTuple):
    """
    Bytes C{start} up to (not including) C{end} of a file.
    """

    start: int
    end: int


class RangeNotSatisfiable(ValueError):
    """
    A C{Range} header that cannot be served (416): unsatisfiable, malformed
    or several ranges.  The message is one line naming it.
    """


def parse_range(header: bytes | None, size: int) -> ByteRange | None:
    """
    The one byte range C{header} asks of a file of C{size} bytes:
    C{bytes=a-b}, C{bytes=a-} or the suffix C{bytes=-n} (RFC 9110 14.1.2);
    C{None} without a header (the whole file).

    @raise RangeNotSatisfiable: several ranges, a malformed header, or a
        range starting at or past the end (C{b} past the end is cut to it).
    """
    if header is None:
        return None
    text = header.decode("latin-1")
    shown = text[:100]
    if "," in text:
        raise RangeNotSatisfiable(f"Range {shown!r}: only one range per request is served")
    match = _RANGE.match(text)
    if match is None or (not match.group(1) and not match.group(2)):
        raise RangeNotSatisfiable(
            f"Range {shown!r} is not bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX"
        )
    first, last = match.group(1), match.group(2)
    if len(first) > 19 or len(last) > 19:
        raise RangeNotSatisfiable(f"Range {shown!r}: a position past any file")
    if not first:
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"Range {shown!r} asks for no bytes of a {size}-byte file")
        return ByteRange(max(0, size - suffix), size)
    start = int(first)
    end = size if not last else min(size, int(last) + 1)
    if last and int(last) < start:
        raise RangeNotSatisfiable(f"Range {shown!r}: the last byte is before the first")
    if start >= size:
        raise RangeNotSatisfiable(
            f"Range {shown!r} starts at or past the end of the {size}-byte file"
        )
    return ByteRange(start, end)


class TokenBucket:
    """
    C{rate} bytes per second for every caller together, first come first
    served.  A caller takes what it is about to send: at once when the
    bucket is not in debt (it may then go into debt by up to one chunk),
    else its callback is queued and called when the debt is paid.  Idle
    time saves up at most C{burst} bytes.  One timer at most.
    """

    def __init__(self, rate: int, clock: IReactorTime, burst: int = CHUNK_SIZE) -> None:
        if rate <= 0:
            raise ValueError(f"rate {rate} is not positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = 0.0
        self._when = clock.seconds()
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()
        self._call: IDelayedCall | None = None

    def _refill(self) -> None:
        now = self._clock.seconds()
        self._tokens = min(float(self.burst), self._tokens + (now - self._when) * self.rate)
        self._when = now

    def try_take(self, amount: int) -> bool:
        """
        Take C{amount} now if nobody is waiting and the bucket is not in
        debt; C{False} (nothing taken) otherwise.
        """
        if self._waiters:
            return False
        self._refill()
        if self._tokens < 0:
            return False
        self._tokens -= amount
        return True

    def wait(self, amount: int, granted: Callable[[], None]) -> Callable[[], None]:
        """
        Call C{granted} once C{amount} is taken for it (never from inside
        this call); the result cancels the wait.
        """
        entry = (amount, granted)
        self._waiters.append(entry)
        self._schedule()

        def cancel() -> None:
            try:
                self._waiters.remove(entry)
            except ValueError:
                return
            if not self._waiters and self._call is not None and self._call.active():
                self._call.cancel()
                self._call = None

        return cancel

    def _schedule(self) -> None:
        if self._call is not None or not self._waiters:
            return
        self._refill()
        delay = max(0.0, -self._tokens / self.rate)
        self._call = self._clock.callLater(delay, self._grant)

    def _grant(self) -> None:
        self._call = None
        self._refill()
        if self._waiters and self._tokens >= -1e-6:
            amount, granted = self._waiters.popleft()
            self._tokens -= amount
            self._schedule()
            granted()
        else:
            self._schedule()

    def pending(self) -> int:
        """
        How many callers are waiting.
        """
        return len(self._waiters)


class CommitLogServer:
    """
    What an admin site serves of a broker's commit log: one L{TokenBucket}
    at C{rate} bytes/s for all readers, at most C{max_streams} bodies at
    once, and the count of bytes sent.
    """

    def __init__(
        self,
        rate: int,
        clock: IReactorTime,
        max_streams: int = MAX_STREAMS,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.rate = rate
        # A chunk is at most a quarter second of the rate: with every
        # stream busy each still writes every second or so, far inside
        # the admin port's idle timeout, however low the rate.
        self.chunk_size = max(1024, min(chunk_size, rate // 4))
        self.bucket = TokenBucket(rate, clock, burst=self.chunk_size)
        self.max_streams = max_streams
        self.streams = 0
        #: Body bytes sent (zeros past the max offset included).
        self.bytes_served = 0


@implementer(IPushProducer)
class SegmentStream:
    """
    The body of one answer: bytes C{start} to C{end} of the segment that
    begins at commit-log offset C{base}, as a push producer on C{request}.
    Reads at most one chunk ahead of the transport: paused while its
    buffer is full, stopped when the client goes away.
    """

    _log = Logger()

    def __init__(
        self,
        server: CommitLogServer,
        commitlog: CommitLog,
        request: Request,
        base: int,
        start: int,
        end: int,
        max_offset: int,
    ) -> None:
        self._server = server
        self._commitlog = commitlog
        self._request = request
        self._base = base
        self._position = start
        self._end = end
        self._max_offset = max_offset
        self._paused = False
        self._done = False
        self._cancel_wait: Callable[[], None] | None = None
        # The bucket granted the next chunk while paused: sent on resume.
        self._granted_chunk = False

    def start(self) -> None:
        """
        Register with the request and send (counted as a stream until done).
        """
        self._server.streams += 1
        self._request.notifyFinish().addErrback(self._client_gone)
        self._request.registerProducer(self, True)
        self._next()

    def _client_gone(self, reason: Failure) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._done:
            return
        self._done = True
        self._server.streams -= 1
        if self._cancel_wait is not None:
            self._cancel_wait()
            self._cancel_wait = None

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        if self._done or not self._paused:
            return
        self._paused = False
        self._next()

    def stopProducing(self) -> None:
        self._stop()

    def _amount(self) -> int:
        return min(self._server.chunk_size, self._end - self._position)

    def _next(self) -> None:
        bucket = self._server.bucket
        while not self._done and not self._paused and self._cancel_wait is None:
            if self._position >= self._end:
                self._finish()
                return
            if self._granted_chunk:
                self._granted_chunk = False
            elif not bucket.try_take(self._amount()):
                self._cancel_wait = bucket.wait(self._amount(), self._granted)
                return
            self._send()

    def _granted(self) -> None:
        self._cancel_wait = None
        self._granted_chunk = True
        self._next()

    def _read(self, amount: int) -> bytes:
        """
        C{amount} bytes at the position: what the commit log holds before
        the max offset, zeros from there on.
        """
        offset = self._base + self._position
        # Clamped to the log's max offset now too: a slave may have cut its
        # tail since the request (what is gone is zeros).
        whole = max(0, min(amount, self._max_offset - offset, self._commitlog.max_offset - offset))
        data = self._commitlog.read(offset, whole) if whole else b""
        return data + bytes(amount - len(data)) if len(data) < amount else data

    def _send(self) -> None:
        amount = self._amount()
        try:
            data = self._read(amount)
        except (StoreError, OSError) as e:
            # The headers promised bytes that cannot be read: cut the
            # connection, so the client sees a short body, not a wrong one.
            self._log.warn(
                "admin HTTP: commit-log read at offset {offset} failed: {error}",
                offset=self._base + self._position,
                error=str(e),
            )
            self._stop()
            channel = self._request.channel
            if channel is not None:
                channel.forceAbortClient()
            return
        self._position += amount
        self._server.bytes_served += amount
        self._request.write(data)

    def _finish(self) -> None:
        self._stop()
        self._request.unregisterProducer()
        self._request.finish()


# -- the resources ------------------------------------------------------------

#: What /commitlog answers when the commit log is not served.
COMMITLOG_NOT_SERVED = (
    "the commit log is not served here: start the broker with "
    "--serve-commitlog RATE (serveCommitLog=RATE in its config file), e.g. 64m "
    "bytes/s (docs/admin.md)"
)


class CommitLogOff(AdminResource):
    """
    /commitlog and below when not served: 404 saying how to serve it.
    """

    isLeaf = True

    def render(self, request: Request) -> bytes | int:
        return error_answer(request, 404, "NOT_FOUND", COMMITLOG_NOT_SERVED)


class CommitLogResource(AdminResource):
    """
    C{GET /commitlog}: the segment files, and the max offset (where whole
    records end now; a reader takes nothing past it).
    """

    def __init__(self, broker: Broker, server: CommitLogServer) -> None:
        super().__init__()
        self._broker = broker
        self._server = server

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"":
            return self
        if request.postpath:
            return NotFound()
        return _SegmentFile(self._broker, self._server, path)

    def render_GET(self, request: Request) -> bytes:
        commitlog = self._broker.commitlog
        size = commitlog.segment_size
        return json_answer(
            request,
            200,
            {
                "status": "OK",
                "role": self._broker.role.value,
                "segment_size": size,
                "min_offset": commitlog.min_offset,
                "max_offset": commitlog.record_end,
                "segments": [
                    {"name": name, "offset": start, "size": size}
                    for name, start, _ in commitlog.segments
                ],
            },
        )


class _SegmentFile(AdminResource):
    """
    C{GET}/C{HEAD /commitlog/{name}}: one segment file's bytes, the whole
    file (200) or one C{Range} (206), zeros at and past the max offset
    the request saw.  Only a name the store lists is served.
    """

    isLeaf = True

    def __init__(self, broker: Broker, server: CommitLogServer, name: bytes) -> None:
        super().__init__()
        self._broker = broker
        self._server = server
        self._name = name.decode("ascii", "replace")

    def _prepare(self, request: Request) -> tuple[bytes | None, tuple[int, int, int, int]]:
        """
        The error to answer, or (segment start offset, first byte, end, max
        offset) with the headers set.
        """
        commitlog = self._broker.commitlog
        found = [start for name, start, _ in commitlog.segments if name == self._name]
        if not found:
            shown = self._name[:40]
            return error_answer(
                request, 404, "NOT_FOUND", f"no commit-log segment {shown!r} here"
            ), (0, 0, 0, 0)
        size = commitlog.segment_size
        try:
            wanted = parse_range(request.getHeader(b"range"), size)
        except RangeNotSatisfiable as e:
            request.setHeader(b"content-range", b"bytes */%d" % size)
            return error_answer(request, 416, "RANGE_NOT_SATISFIABLE", str(e)), (0, 0, 0, 0)
        start, end = (0, size) if wanted is None else wanted
        max_offset = commitlog.record_end
        request.setHeader(b"accept-ranges", b"bytes")
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"x-rmqha-max-offset", b"%d" % max_offset)
        request.setHeader(b"content-length", b"%d" % (end - start))
        if wanted is not None:
            request.setResponseCode(206)
            request.setHeader(b"content-range", b"bytes %d-%d/%d" % (start, end - 1, size))
        return None, (found[0], start, end, max_offset)

    def render_HEAD(self, request: Request) -> bytes:
        error, _ = self._prepare(request)
        return error if error is not None else b""

    def render_GET(self, request: Request) -> bytes | int:
        server = self._server
        if server.streams >= server.max_streams:
            request.setHeader(b"retry-after", b"%d" % RETRY_AFTER)
            return error_answer(
                request,
                503,
                "BUSY",
                f"{server.max_streams} commit-log streams are being served; "
                f"retry in {RETRY_AFTER} s",
            )
        error, (base, start, end, max_offset) = self._prepare(request)
        if error is not None:
            return error
        SegmentStream(
            server, self._broker.commitlog, request, base, start, end, max_offset
        ).start()
        return NOT_DONE_YET


