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
