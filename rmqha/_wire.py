# -*- test-case-name: tests.test_wire -*-
"""
The classic RocketMQ HA wire protocol (4.9.x and 5.x DefaultHA), bytes in
and frames out, with no I/O and no Twisted.

Slave to master, repeated::

    +--------------------------------+
    | slave max offset   int64 BE    |     8 bytes ("report")
    +--------------------------------+

Master to slave, repeated::

    +--------------------------------+----------------+---------------------+
    | offset   int64 BE              | size  int32 BE | body (size bytes)   |
    +--------------------------------+----------------+---------------------+

C{body} is commit-log bytes starting at C{offset}, never crossing a segment;
C{size} 0 is a heartbeat (C{offset} is where the master will continue).
There is no handshake, magic or version.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "REPORT_SIZE",
    "HEADER_SIZE",
    "MAX_BODY_SIZE",
    "ProtocolError",
    "TransferFrame",
    "encode_report",
    "encode_header",
    "ReportDecoder",
    "TransferDecoder",
    "CONTROL_HELLO",
    "CONTROL_INFO",
    "CONTROL_DIGEST",
    "CONTROL_MAX_DIGEST_RANGE",
    "CONTROL_INFO_SIZE",
    "CONTROL_REQUEST_SIZE",
    "CONTROL_DIGEST_SIZE",
    "encode_control_hello",
    "encode_control_info",
    "decode_control_info",
    "encode_digest_request",
    "decode_digest_request",
    "encode_digest_answer",
    "decode_digest_answer",
]

REPORT_SIZE = 8
HEADER_SIZE = 12
#: A RocketMQ slave reads into a 4 MiB buffer that must hold the header
#: too (C{HAClient.READ_MAX_BUFFER_SIZE}); no frame body may be larger.
MAX_BODY_SIZE = 4 * 1024 * 1024 - HEADER_SIZE

_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")


class ProtocolError(ValueError):
    """
    A peer sent something the protocol does not allow; the text says what.
    """


class TransferFrame(NamedTuple):
    """
    One master-to-slave frame: C{body} belongs at commit-log C{offset}.
    An empty body is a heartbeat.  C{body} may be a read-only
    C{memoryview} of the received bytes.
    """

    offset: int
    body: bytes | memoryview

    @property
    def is_heartbeat(self) -> bool:
        return not self.body


def _check_offset(offset: int) -> None:
    if not 0 <= offset < 1 << 63:
        raise ValueError(f"offset {offset} is outside 0..2**63-1")


def encode_report(offset: int) -> bytes:
    """
    The 8-byte report of a slave whose commit log ends at C{offset}.
    """
    _check_offset(offset)
    return _REPORT.pack(offset)


def encode_header(offset: int, size: int) -> bytes:
    """
    The 12-byte header of a frame of C{size} body bytes from C{offset}
    (C{size} 0: a heartbeat).
    """
    _check_offset(offset)
    if not 0 <= size <= MAX_BODY_SIZE:
        raise ValueError(f"frame body size {size} is outside 0..{MAX_BODY_SIZE}")
    return _HEADER.pack(offset, size)


class ReportDecoder:
    """
    The master's side: slave reports, parsed the way RocketMQ's master
    parses them.  The stream is cut into 8-byte values from its first byte;
    of the values completed by one read only the last counts (the Java
    master reads into a buffer and takes the last 8-byte-aligned long), so
    intermediate acks in one read are skipped.
    """

    def __init__(self) -> None:
        self._partial = b""
        #: Reports decoded so far, skipped ones included.
        self.count = 0

    def feed(self, data: bytes) -> int | None:
        """
        Take the bytes of one read.

        @return: the last report they complete, or C{None}.
        @raise ProtocolError: that report is a negative offset.
        """
        if self._partial:
            data = self._partial + data
        whole = len(data) - len(data) % REPORT_SIZE
        self._partial = data[whole:]
        if not whole:
            return None
        self.count += whole // REPORT_SIZE
        (offset,) = _REPORT.unpack_from(data, whole - REPORT_SIZE)
        if offset < 0:
            raise ProtocolError(f"slave reported a negative offset {offset}")
        return offset


class TransferDecoder:
    """
    The slave's side: master frames out of a byte stream, one at a time so
    the caller can stop between frames (for backpressure) — Twisted's
    C{IntNStringReceiver} loop, without the protocol.

    Sizes are checked as soon as a header is complete, before any body is
    buffered for it.  A frame wholly inside one read is returned without
    copying (its body is a C{memoryview} of the bytes that were fed, which
    are immutable); only a frame cut across reads is assembled in a buffer.
    """

    def __init__(self, max_body_size: int = MAX_BODY_SIZE) -> None:
        if not 0 <= max_body_size <= MAX_BODY_SIZE:
            raise ValueError(
                f"max body size {max_body_size} is outside 0..{MAX_BODY_SIZE}"
            )
        self.max_body_size = max_body_size
        # Bytes of earlier reads not yet returned (at most a frame in
        # normal use), then the latest read and how much of it is used.
        self._partial = bytearray()
        self._data = memoryview(b"")
        self._position = 0

    @property
    def buffered(self) -> int:
        """
        Bytes received but not yet returned as frames.
        """
        return len(self._partial) + len(self._data) - self._position

    def feed(self, data: bytes) -> None:
        """
        Add received bytes; take frames with L{next_frame}.
        """
        if self._position < len(self._data):
            # The caller stopped between frames: keep the rest.
            self._partial += self._data[self._position :]
        self._data = memoryview(data)
        self._position = 0

    def pending_header(self) -> tuple[int, int] | None:
        """
        The C{(offset, size)} of the next frame once its header is here,
        even if its body is not (RocketMQ's slave checks the offset then).

        @raise ProtocolError: the header is invalid.
        """
        partial = self._partial
        if not partial:
            if len(self._data) - self._position < HEADER_SIZE:
                return None
            offset, size = _HEADER.unpack_from(self._data, self._position)
        elif len(partial) >= HEADER_SIZE:
            offset, size = _HEADER.unpack_from(partial, 0)
        elif self.buffered >= HEADER_SIZE:
            needed = HEADER_SIZE - len(partial)
            offset, size = _HEADER.unpack(
                bytes(partial) + self._data[self._position : self._position + needed]
            )
        else:
            return None
        if offset < 0:
            raise ProtocolError(f"master sent a frame at negative offset {offset}")
        if not 0 <= size <= self.max_body_size:
            raise ProtocolError(
                f"master sent a frame of {size} bytes at offset {offset}; the "
                f"limit is 0..{self.max_body_size}"
            )
        return offset, size

    def next_frame(self) -> TransferFrame | None:
        """
        The next complete frame, or C{None} until more bytes are fed.

        @raise ProtocolError: a header is invalid (the stream cannot be
            resynchronised: drop the connection).
        """
        header = self.pending_header()
        if header is None:
            return None
        offset, size = header
        total = HEADER_SIZE + size
        if self.buffered < total:
            return None
        partial = self._partial
        body: bytes | memoryview
        if not partial:
            start = self._position + HEADER_SIZE
            body = self._data[start : start + size]
            self._position += total
        elif len(partial) >= total:
            body = bytes(partial[HEADER_SIZE:total])
            del partial[:total]
        else:
            missing = total - len(partial)
            partial += self._data[self._position : self._position + missing]
            self._position += missing
            body = bytes(partial[HEADER_SIZE:])
            partial.clear()
        return TransferFrame(offset, body)


# -- the rmqha control extension (docs/protocol.md) ---------------------------
#
# A separate connection to the same HA port.  Every message starts with a
# negative int64 code: a genuine RocketMQ master takes the hello for a first
# report, finds no data at a negative offset and stays silent (or sends a
# heartbeat whose offset is that same hello), so an rmqha slave recognises
# a classic master by the absence of the INFO answer.

#: Slave to master, 8 bytes: "rmqha control, version 1".
CONTROL_HELLO = -0x524D514841_0001
#: Master to slave: code, min offset, max offset, segment size (28 bytes).
CONTROL_INFO = -0x524D514841_0002
#: Request: code, start, end (24 bytes); answer: code, start, end, a
#: 16-byte blake2b digest of the master's bytes [start, end) (40 bytes).
#: An answer with start = end = -1 refuses the range.
CONTROL_DIGEST = -0x524D514841_0003
#: The most bytes one digest request may cover.
CONTROL_MAX_DIGEST_RANGE = 16 * 1024 * 1024

_CONTROL_INFO = struct.Struct(">qqqi")
_CONTROL_REQUEST = struct.Struct(">qqq")
_CONTROL_DIGEST = struct.Struct(">qqq16s")
CONTROL_INFO_SIZE = _CONTROL_INFO.size
CONTROL_REQUEST_SIZE = _CONTROL_REQUEST.size
CONTROL_DIGEST_SIZE = _CONTROL_DIGEST.size


def encode_control_hello() -> bytes:
    return _REPORT.pack(CONTROL_HELLO)


def encode_control_info(min_offset: int, max_offset: int, segment_size: int) -> bytes:
    return _CONTROL_INFO.pack(CONTROL_INFO, min_offset, max_offset, segment_size)


def decode_control_info(data: bytes) -> tuple[int, int, int] | None:
    """
    C{(min offset, max offset, segment size)}, or C{None} if C{data} is
    not an INFO message.
    """
    if len(data) < CONTROL_INFO_SIZE:
        return None
    code, min_offset, max_offset, segment_size = _CONTROL_INFO.unpack_from(data)
    if code != CONTROL_INFO or not 0 <= min_offset <= max_offset or segment_size <= 0:
        return None
    return min_offset, max_offset, segment_size


def encode_digest_request(start: int, end: int) -> bytes:
    return _CONTROL_REQUEST.pack(CONTROL_DIGEST, start, end)


def decode_digest_request(data: bytes | bytearray) -> tuple[int, int]:
    code, start, end = _CONTROL_REQUEST.unpack_from(data)
    if code != CONTROL_DIGEST:
        raise ProtocolError(f"control request code {code} is not DIGEST")
    return start, end


def encode_digest_answer(start: int, end: int, digest: bytes) -> bytes:
    return _CONTROL_DIGEST.pack(CONTROL_DIGEST, start, end, digest)


def decode_digest_answer(data: bytes | bytearray) -> tuple[int, int, bytes]:
    code, start, end, digest = _CONTROL_DIGEST.unpack_from(data)
    if code != CONTROL_DIGEST:
        raise ProtocolError(f"control answer code {code} is not DIGEST")
    return start, end, digest
