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
There is no handshake, magic or version, and no checksum.

Two rmqha peers may agree on I{checked framing} (docs/protocol.md): the
same stream with a CRC-32 on every report and every frame, so a byte
flipped on the way is caught before it is written or counted.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from rmqha.store._record import crc32

__all__ = [
    "REPORT_SIZE",
    "HEADER_SIZE",
    "MAX_BODY_SIZE",
    "ProtocolError",
    "ChecksumError",
    "TransferFrame",
    "encode_report",
    "encode_header",
    "checked_header",
    "encode_checked_header",
    "CHECKED_HELLO",
    "CHECKED_ACK",
    "CHECKED_REPORT_SIZE",
    "CHECKED_HEADER_SIZE",
    "FEATURE_CHECKED_FRAMING",
    "ReportDecoder",
    "TransferDecoder",
    "CONTROL_PROBE",
    "CONTROL_HELLO",
    "CONTROL_INFO",
    "CONTROL_DIGEST",
    "CONTROL_REFUSED",
    "CONTROL_MAX_DIGEST_RANGE",
    "CONTROL_INFO_SIZE",
    "CONTROL_REQUEST_SIZE",
    "CONTROL_DIGEST_SIZE",
    "NotControlError",
    "encode_code",
    "encode_control_info",
    "decode_control_info",
    "encode_digest_request",
    "decode_digest_request",
    "encode_digest_answer",
    "decode_digest_answer",
    "decode_control_request",
    "CONTROL_EPOCHS",
    "FEATURE_EPOCHS",
    "MAX_EPOCH_ENTRIES",
    "EpochsAnswer",
    "encode_epochs_request",
    "encode_epochs_answer",
    "decode_epochs_answer",
    "IDENTIFY",
    "NOT_MASTER",
    "encode_not_master",
    "decode_not_master",
    "FEATURE_IDENTIFY",
    "MAX_REPLICA_ID",
    "encode_identify",
    "decode_identify",
    "AUTH_HELLO",
    "AUTH_CHALLENGE",
    "AUTH_PROOF",
    "AUTH_ACCEPTED",
    "AUTH_REFUSED",
    "AUTH_NONCE_SIZE",
    "AUTH_MAC_SIZE",
    "AUTH_PROOF_SIZE",
    "FEATURE_GROUP_AUTH",
    "AuthHello",
    "AuthChallenge",
    "encode_auth_hello",
    "decode_auth_hello",
    "encode_auth_challenge",
    "decode_auth_challenge",
    "encode_auth_proof",
    "decode_auth_proof",
    "CLOSING",
    "MAX_CLOSING_TEXT",
    "MasterClosing",
    "encode_closing",
    "decode_closing",
    "is_closing",
    "Greeting",
    "sniff_greeting",
]

REPORT_SIZE = 8
HEADER_SIZE = 12
#: A RocketMQ slave reads into a 4 MiB buffer that must hold the header
#: too (C{HAClient.READ_MAX_BUFFER_SIZE}); no frame body may be larger.
MAX_BODY_SIZE = 4 * 1024 * 1024 - HEADER_SIZE

_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")

# -- checked framing (an rmqha extension, docs/protocol.md) -------------------
#
# Negotiated: the slave only asks a master whose control INFO offered it,
# by sending CHECKED_HELLO as its first 8 bytes; the master confirms with
# CHECKED_ACK before its first frame.  A RocketMQ peer never sees either.

#: Slave to master, the first 8 bytes of a replication connection.
CHECKED_HELLO = -0x524D514841_0004
#: Master to slave, the first 8 bytes of its answer to CHECKED_HELLO.
CHECKED_ACK = -0x524D514841_0005
#: The control INFO feature bit of a master that speaks checked framing.
FEATURE_CHECKED_FRAMING = 1
#: Report: offset, CRC-32 of the 8 offset bytes.
_CHECKED_REPORT = struct.Struct(">qI")
#: Header: offset, size, CRC-32 of the body, CRC-32 of the 16 bytes before.
_CHECKED_HEADER = struct.Struct(">qiII")
CHECKED_REPORT_SIZE = _CHECKED_REPORT.size
CHECKED_HEADER_SIZE = _CHECKED_HEADER.size
_CHECKED_ACK_BYTES = _REPORT.pack(CHECKED_ACK)


class ProtocolError(ValueError):
    """
    A peer sent something the protocol does not allow; the text says what.
    """


class ChecksumError(ProtocolError):
    """
    Checked framing: bytes do not match the CRC sent with them.
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


def encode_report(offset: int, checked: bool = False) -> bytes:
    """
    The report of a slave whose commit log ends at C{offset}: 8 bytes, or
    12 with checked framing.
    """
    _check_offset(offset)
    report = _REPORT.pack(offset)
    return _sealed(report) if checked else report


def encode_header(offset: int, size: int) -> bytes:
    """
    The 12-byte header of a frame of C{size} body bytes from C{offset}
    (C{size} 0: a heartbeat).
    """
    _check_offset(offset)
    if not 0 <= size <= MAX_BODY_SIZE:
        raise ValueError(f"frame body size {size} is outside 0..{MAX_BODY_SIZE}")
    return _HEADER.pack(offset, size)


def _sealed(message: bytes) -> bytes:
    """
    C{message} followed by its CRC-32 (checked reports and headers, control
    messages after the hello).
    """
    return message + crc32(message).to_bytes(4, "big")


def encode_checked_header(offset: int, body: bytes | memoryview) -> bytes:
    """
    The 20-byte checked framing header of a frame carrying C{body} from
    C{offset} (an empty body: a heartbeat).
    """
    return checked_header(offset, len(body), crc32(body))


def checked_header(offset: int, size: int, body_crc: int) -> bytes:
    """
    L{encode_checked_header} of a body of C{size} bytes whose CRC-32 is
    C{body_crc} (a body sent from the file, never in hand).
    """
    return _sealed(encode_header(offset, size) + body_crc.to_bytes(4, "big"))


def _crc_error(what: str, sent: int, computed: int) -> "ChecksumError":
    return ChecksumError(
        f"{what} fails its checksum (sent {sent:08x}, computed {computed:08x}): "
        f"bytes were damaged on the way"
    )


class ReportDecoder:
    """
    The master's side: slave reports, parsed the way RocketMQ's master
    parses them.  The stream is cut into 8-byte values from its first byte;
    of the values completed by one read only the last counts (the Java
    master reads into a buffer and takes the last 8-byte-aligned long), so
    intermediate acks in one read are skipped.
    """

    def __init__(self, checked: bool = False) -> None:
        """
        @param checked: reports are checked framing reports (12 bytes, each
            one's CRC verified).
        """
        self._partial = b""
        self.checked = checked
        self._size = CHECKED_REPORT_SIZE if checked else REPORT_SIZE
        #: Reports decoded so far, skipped ones included.
        self.count = 0

    def feed(self, data: bytes) -> int | None:
        """
        Take the bytes of one read.

        @return: the last report they complete, or C{None}.
        @raise ProtocolError: that report is a negative offset.
        @raise ChecksumError: with checked framing, a report they complete
            (skipped ones included) fails its CRC.
        """
        if self._partial:
            data = self._partial + data
        size = self._size
        whole = len(data) - len(data) % size
        self._partial = data[whole:]
        if not whole:
            return None
        self.count += whole // size
        if self.checked:
            for position in range(0, whole, size):
                offset, crc = _CHECKED_REPORT.unpack_from(data, position)
                computed = crc32(data[position : position + 8])
                if crc != computed:
                    raise _crc_error(f"the report of offset {offset}", crc, computed)
        (offset,) = _REPORT.unpack_from(data, whole - size)
        if offset < 0:
            raise ProtocolError(f"slave reported a negative offset {offset}")
        return int(offset)


#: A rest of a read at least this long is kept as a view of the read (the
#: read's bytes stay alive until the frame is returned); shorter ones are
#: copied together.
_HELD_VIEW_MIN = 4096


class TransferDecoder:
    """
    The slave's side: master frames out of a byte stream, one at a time so
    the caller can stop between frames (for backpressure) — Twisted's
    C{IntNStringReceiver} loop, without the protocol.

    Sizes are checked as soon as a header is complete, before any body is
    buffered for it.  A frame wholly inside one read is returned without
    copying (its body is a C{memoryview} of the bytes that were fed, which
    are immutable); a frame cut across reads is assembled only when asked
    for as one buffer (L{next_frame_pieces} gives its pieces).
    """

    def __init__(self, max_body_size: int = MAX_BODY_SIZE, checked: bool = False) -> None:
        """
        @param checked: the stream is checked framing: it starts with
            C{CHECKED_ACK}, headers are 20 bytes and every header's and
            body's CRC is verified (a header's as soon as it is here).
        """
        if not 0 <= max_body_size <= MAX_BODY_SIZE:
            raise ValueError(
                f"max body size {max_body_size} is outside 0..{MAX_BODY_SIZE}"
            )
        self.max_body_size = max_body_size
        self.checked = checked
        self._header_size = CHECKED_HEADER_SIZE if checked else HEADER_SIZE
        # Checked framing: the master's confirmation, until it is whole.
        self._ack: bytearray | None = bytearray() if checked else None
        # The body CRC of the pending header (checked framing).
        self._body_crc = 0
        # The pending header's (offset, size), once checked.
        self._pending: tuple[int, int] | None = None
        # Bytes of earlier reads not yet returned (at most a frame and a
        # header in normal use), in order: views of the reads themselves
        # (bytes, immutable), or, for short leftovers, a buffer they are
        # gathered in (so that a stream of tiny reads cannot make a piece
        # per byte); then the latest read and how much of it is used.
        self._held: list[bytes | bytearray | memoryview] = []
        self._held_size = 0
        self._data = memoryview(b"")
        self._position = 0

    @property
    def buffered(self) -> int:
        """
        Bytes received but not yet returned as frames.
        """
        return self._held_size + len(self._data) - self._position

    @property
    def confirmed(self) -> bool:
        """
        Classic framing, or checked framing the master has confirmed.
        """
        return self._ack is None

    def feed(self, data: bytes) -> None:
        """
        Add received bytes; take frames with L{next_frame}.

        @raise ProtocolError: checked framing, and the stream does not start
            with the master's C{CHECKED_ACK}.
        """
        if self._ack is not None:
            self._ack += data
            if len(self._ack) < 8:
                return
            if self._ack[:8] != _CHECKED_ACK_BYTES:
                raise ProtocolError(
                    "the master did not confirm checked framing (its first 8 bytes "
                    f"are {bytes(self._ack[:8]).hex()})"
                )
            data = bytes(self._ack[8:])
            self._ack = None
        rest = len(self._data) - self._position
        if rest:
            # The caller stopped between frames, or a frame is cut: keep
            # the rest (a view of the read; short rests are copied).
            leftover = self._data[self._position :]
            held = self._held
            if rest >= _HELD_VIEW_MIN:
                held.append(leftover)
            elif held and isinstance(held[-1], bytearray):
                held[-1] += leftover
            else:
                held.append(bytearray(leftover))
            self._held_size += rest
        self._data = memoryview(data)
        self._position = 0

    def _take(self, size: int) -> list[memoryview]:
        """
        Remove the next C{size} buffered bytes (there are that many) and
        return them as views, in order, without copying.
        """
        pieces: list[memoryview] = []
        held = self._held
        while size and held:
            piece = memoryview(held[0])
            if len(piece) <= size:
                held.pop(0)
            else:
                held[0], piece = piece[size:], piece[:size]
            pieces.append(piece)
            size -= len(piece)
            self._held_size -= len(piece)
        if size:
            position = self._position
            pieces.append(self._data[position : position + size])
            self._position = position + size
        return pieces

    def _header(self) -> bytes | memoryview | None:
        """
        The next header's bytes once they are all here.
        """
        size = self._header_size
        if not self._held:
            if len(self._data) - self._position < size:
                return None
            return self._data[self._position : self._position + size]
        return self._peek(size)

    def _peek(self, size: int) -> bytes | memoryview | None:
        """
        The next C{size} buffered bytes once they are all here (not taken).
        """
        if not self._held:
            if len(self._data) - self._position < size:
                return None
            return self._data[self._position : self._position + size]
        if self.buffered < size:
            return None
        header = bytearray()
        for piece in self._held:
            header += piece[: size - len(header)]
            if len(header) == size:
                return bytes(header)
        return bytes(header) + self._data[self._position : self._position + size - len(header)]

    def pending_header(self) -> tuple[int, int] | None:
        """
        The C{(offset, size)} of the next frame once its header is here,
        even if its body is not (RocketMQ's slave checks the offset then).

        @raise ProtocolError: the header is invalid.
        @raise ChecksumError: checked framing, and the header fails its CRC.
        """
        if self._pending is not None:
            return self._pending
        header = self._header()
        if header is None:
            if self.checked and (self._held or self._position < len(self._data)):
                self._closing()  # (one shorter than a header, once whole)
            return None
        if self.checked:
            offset, size, self._body_crc, crc = _CHECKED_HEADER.unpack(header)
            if offset == CLOSING:
                self._closing()
                return None
            computed = crc32(header[:16])
            if crc != computed:
                raise _crc_error("a frame header", crc, computed)
        else:
            offset, size = _HEADER.unpack(header)
        if offset < 0:
            raise ProtocolError(f"master sent a frame at negative offset {offset}")
        if not 0 <= size <= self.max_body_size:
            raise ProtocolError(
                f"master sent a frame of {size} bytes at offset {offset}; the "
                f"limit is 0..{self.max_body_size}"
            )
        # (Kept until the frame is returned: a large frame arriving in many
        # reads has its header gathered, unpacked and checked once.)
        self._pending = offset, size
        return self._pending

    def _closing(self) -> None:
        """
        The master's CLOSING, in place of a header: once it is whole,
        raise L{MasterClosing} with its text (the stream ends there).
        Nothing, when the next bytes are not one.
        """
        code = self._peek(8)
        if code is None or bytes(code) != _CLOSING_CODE:
            return
        head = self._peek(_CLOSING_HEAD.size)
        if head is None:
            return
        _, length = _CLOSING_HEAD.unpack(head)
        if length > MAX_CLOSING_TEXT:
            raise ProtocolError(f"CLOSING of {length} bytes; the limit is {MAX_CLOSING_TEXT}")
        message = self._peek(_CLOSING_HEAD.size + length + 4)
        if message is None:
            return
        found = decode_closing(bytes(message))
        assert found is not None
        raise MasterClosing(found[0])

    def next_frame(self) -> TransferFrame | None:
        """
        The next complete frame, or C{None} until more bytes are fed.

        @raise ProtocolError: a header is invalid (the stream cannot be
            resynchronised: drop the connection).
        @raise ChecksumError: checked framing, and a header or body fails
            its CRC (nothing of that frame is returned).
        """
        frame = self.next_frame_pieces()
        if frame is None:
            return None
        offset, pieces = frame
        if len(pieces) == 1:
            return TransferFrame(offset, pieces[0])
        return TransferFrame(offset, b"".join(pieces))

    def next_frame_pieces(self) -> tuple[int, list[memoryview]] | None:
        """
        Like L{next_frame}, but the body as the pieces of the reads it came
        in (views, nothing copied; one piece for a frame wholly inside a
        read, none for a heartbeat): a frame cut across reads is not
        assembled.
        """
        header = self.pending_header()
        if header is None:
            return None
        offset, size = header
        header_size = self._header_size
        if self.buffered < header_size + size:
            return None
        self._pending = None
        if not self._held:
            start = self._position + header_size
            pieces = [self._data[start : start + size]] if size else []
            self._position = start + size
        else:
            self._take(header_size)
            pieces = self._take(size)
        if self.checked:
            computed = 0
            for piece in pieces:
                computed = crc32(piece, computed)
            if computed != self._body_crc:
                raise _crc_error(
                    f"the frame of {size} bytes at offset {offset}", self._body_crc, computed
                )
        return offset, pieces


# -- the rmqha control extension (docs/protocol.md) ---------------------------
#
# A separate connection to the same HA port.  Every message starts with a
# negative int64 code.  The slave opens with CONTROL_PROBE, -1: RocketMQ
# 4.9.8's HAConnection keeps "no request offset yet" as -1, so a genuine
# master that reads -1 as a first report still waits for one, silently
# (no warning, nothing sent); an rmqha master answers INFO at once.  A
# slave recognises a classic master by the absence of that answer.

#: Slave to master, 8 bytes: the control hello that a RocketMQ master
#: cannot tell from no report at all.
CONTROL_PROBE = -1
#: Slave to master, 8 bytes: "rmqha control, version 1", the hello of
#: older rmqha slaves (still answered; a RocketMQ master takes it for a
#: negative request offset and logs "Offset not matched" on every turn).
CONTROL_HELLO = -0x524D514841_0001
#: Master to slave: code, min offset, max offset, segment size, feature
#: bits, CRC-32 of the bytes before it (36 bytes).
CONTROL_INFO = -0x524D514841_0002
#: Request: code, start, end, CRC (28 bytes); answer: code, start, end, a
#: 16-byte blake2b digest of the master's bytes [start, end), CRC (44
#: bytes).  An answer with start = end = -1 refuses the range.
CONTROL_DIGEST = -0x524D514841_0003
#: Master to slave, 8 bytes, then the master closes: a negative first value
#: that is no code it knows (a hello damaged on the way: try again).  Only
#: ever sent in answer to a negative value, which RocketMQ slaves never send.
CONTROL_REFUSED = -0x524D514841_0006
#: The most bytes one digest request may cover.
CONTROL_MAX_DIGEST_RANGE = 16 * 1024 * 1024

_CONTROL_INFO = struct.Struct(">qqqiI")
_CONTROL_REQUEST = struct.Struct(">qqq")
_CONTROL_DIGEST = struct.Struct(">qqq16s")
# Every control message but the hello ends with a CRC-32 of what precedes.
CONTROL_INFO_SIZE = _CONTROL_INFO.size + 4
CONTROL_REQUEST_SIZE = _CONTROL_REQUEST.size + 4
CONTROL_DIGEST_SIZE = _CONTROL_DIGEST.size + 4
_CONTROL_INFO_CODE = _REPORT.pack(CONTROL_INFO)


class NotControlError(ProtocolError):
    """
    The peer answered a control hello with something other than INFO: it
    does not speak the extension (a RocketMQ master).
    """


def _unsealed(data: bytes | bytearray, size: int, what: str) -> bytes:
    """
    The first C{size} bytes of C{data} without their trailing CRC.

    @raise ChecksumError: the CRC does not match.
    """
    message = bytes(data[: size - 4])
    sent = int.from_bytes(data[size - 4 : size], "big")
    computed = crc32(message)
    if sent != computed:
        raise _crc_error(what, sent, computed)
    return message


def encode_code(code: int) -> bytes:
    """
    An 8-byte code (C{CHECKED_HELLO}, C{CHECKED_ACK}, C{CONTROL_REFUSED}).
    """
    return _REPORT.pack(code)


def encode_control_info(
    min_offset: int, max_offset: int, segment_size: int, features: int = 0
) -> bytes:
    return _sealed(
        _CONTROL_INFO.pack(CONTROL_INFO, min_offset, max_offset, segment_size, features)
    )


def decode_control_info(data: bytes | bytearray) -> tuple[int, int, int, int]:
    """
    C{(min offset, max offset, segment size, feature bits)} from the first
    L{CONTROL_INFO_SIZE} bytes of C{data}.

    @raise NotControlError: C{data} does not start with the INFO code.
    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: the values are impossible.
    """
    if bytes(data[:8]) != _CONTROL_INFO_CODE:
        raise NotControlError(
            f"the master answered the control hello with {bytes(data[:8]).hex()}, not INFO"
        )
    message = _unsealed(data, CONTROL_INFO_SIZE, "control INFO")
    _, min_offset, max_offset, segment_size, features = _CONTROL_INFO.unpack(message)
    if not 0 <= min_offset <= max_offset or segment_size <= 0:
        raise ProtocolError(
            f"control INFO is impossible: min offset {min_offset}, max offset "
            f"{max_offset}, segment size {segment_size}"
        )
    return min_offset, max_offset, segment_size, features


def encode_digest_request(start: int, end: int) -> bytes:
    return _sealed(_CONTROL_REQUEST.pack(CONTROL_DIGEST, start, end))


def decode_digest_request(data: bytes | bytearray) -> tuple[int, int]:
    """
    @raise ChecksumError: the request was damaged.
    @raise ProtocolError: it is not a DIGEST request.
    """
    code, start, end = _CONTROL_REQUEST.unpack(
        _unsealed(data, CONTROL_REQUEST_SIZE, "control request")
    )
    if code != CONTROL_DIGEST:
        raise ProtocolError(f"control request code {code} is not DIGEST")
    return start, end


def encode_digest_answer(start: int, end: int, digest: bytes) -> bytes:
    return _sealed(_CONTROL_DIGEST.pack(CONTROL_DIGEST, start, end, digest))


def decode_digest_answer(data: bytes | bytearray) -> tuple[int, int, bytes]:
    """
    @raise ChecksumError: the answer was damaged.
    @raise ProtocolError: it is not a DIGEST answer.
    """
    code, start, end, digest = _CONTROL_DIGEST.unpack(
        _unsealed(data, CONTROL_DIGEST_SIZE, "control DIGEST answer")
    )
    if code != CONTROL_DIGEST:
        raise ProtocolError(f"control answer code {code} is not DIGEST")
    return start, end, digest


# -- replica identity (an rmqha extension, docs/protocol.md) -----------------
#
# A slave tells the master which replica it is, so that the quorum counts
# replicas, not connections.  Sent first on a replication connection (before
# CHECKED_HELLO or the first report), and only to a master whose control
# INFO offered it: a RocketMQ master never sees it.  Unauthenticated: under
# TLS the certificate's name is the identity and this id is not used.

#: Slave to master: code, id length (int16), the id in UTF-8, CRC-32.
IDENTIFY = -0x524D514841_0007
#: The control INFO feature bit of a master that takes IDENTIFY.
FEATURE_IDENTIFY = 2
#: The longest replica id, in UTF-8 bytes.
MAX_REPLICA_ID = 255

_IDENTIFY_HEAD = struct.Struct(">qH")


def _encode_id(node_id: str, what: str) -> bytes:
    """
    C{node_id} as a C{uint16} length and its UTF-8 bytes.

    @raise ValueError: the id is empty, too long or not printable.
    """
    data = node_id.encode("utf-8")
    if not 0 < len(data) <= MAX_REPLICA_ID or not node_id.isprintable():
        raise ValueError(
            f"{what} {node_id!r} must be 1 to {MAX_REPLICA_ID} bytes of printable UTF-8"
        )
    return len(data).to_bytes(2, "big") + data


def _decode_with_id(
    data: bytes | bytearray, code: int, name: str, tail: int
) -> tuple[str, bytes, int] | None:
    """
    A sealed message at the start of C{data}: C{code}, a C{uint16}
    length, that many bytes of id, C{tail} more bytes, a CRC-32.  The
    length is checked as soon as it is here, before waiting for the rest.

    @return: C{(id, tail bytes, size)}, or C{None} until it is whole.
    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: not C{code}, or the length or the id is impossible.
    """
    if len(data) < _IDENTIFY_HEAD.size:
        return None
    found, length = _IDENTIFY_HEAD.unpack_from(data)
    if found != code:
        raise ProtocolError(f"code {found} is not {name}")
    if not 0 < length <= MAX_REPLICA_ID:
        raise ProtocolError(f"{name} id of {length} bytes; the limit is 1..{MAX_REPLICA_ID}")
    size = _IDENTIFY_HEAD.size + length + tail + 4
    if len(data) < size:
        return None
    message = _unsealed(data, size, name)
    end = _IDENTIFY_HEAD.size + length
    try:
        node_id = message[_IDENTIFY_HEAD.size : end].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"the {name} id is not UTF-8") from None
    if not node_id.isprintable():
        raise ProtocolError(f"the {name} id {node_id!r} is not printable")
    return node_id, message[end:], size


def encode_identify(replica_id: str) -> bytes:
    """
    The IDENTIFY message of replica C{replica_id}.

    @raise ValueError: the id is empty, too long or not printable.
    """
    return _sealed(_REPORT.pack(IDENTIFY) + _encode_id(replica_id, "replica id"))


def decode_identify(data: bytes | bytearray) -> tuple[str, int] | None:
    """
    The replica id at the start of C{data} (which starts with the IDENTIFY
    code) and the bytes it took, or C{None} until the message is whole.

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: the length or the id is impossible.
    """
    found = _decode_with_id(data, IDENTIFY, "IDENTIFY", 0)
    if found is None:
        return None
    replica_id, _, size = found
    return replica_id, size


# -- not the master (an rmqha extension for failover, docs/protocol.md) --------
#
# A failover node holds its HA port for its whole life, in every role, so
# that nothing else can listen there while it is not the master.  A node
# that is not the master answers an rmqha greeting (a control hello,
# IDENTIFY, CHECKED_HELLO) with NOT_MASTER and closes; a classic slave's
# first report is answered by closing the connection.

#: Master-port to slave: code, reason length (int16), the reason in UTF-8,
#: CRC-32.
NOT_MASTER = -0x524D514841_0010
#: The longest NOT_MASTER reason, in UTF-8 bytes.
MAX_NOT_MASTER_REASON = 400

_NOT_MASTER_HEAD = struct.Struct(">qH")


def _encode_reason(code: int, reason: str, limit: int) -> bytes:
    """
    A message saying why (NOT_MASTER, CLOSING): C{code}, the length
    (uint16) and the UTF-8 of C{reason} cut to C{limit} bytes at a
    character boundary, CRC-32.
    """
    data = reason.encode("utf-8")[:limit].decode("utf-8", "ignore").encode()
    return _sealed(_NOT_MASTER_HEAD.pack(code, len(data)) + data)


def _decode_reason(
    data: bytes | bytearray, code: int, name: str, limit: int
) -> tuple[str, int] | None:
    """
    The reason of the message C{_encode_reason} made at the start of
    C{data} (which starts with C{code}) and the bytes it took, or C{None}
    until the message is whole.  The length is checked as soon as it is
    here, before waiting for the rest.

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: the length is impossible, or the text not UTF-8.
    """
    if len(data) < _NOT_MASTER_HEAD.size:
        return None
    found, length = _NOT_MASTER_HEAD.unpack_from(data)
    if found != code:
        raise ProtocolError(f"code {found} is not {name}")
    if length > limit:
        raise ProtocolError(f"{name} of {length} bytes; the limit is {limit}")
    size = _NOT_MASTER_HEAD.size + length + 4
    if len(data) < size:
        return None
    message = _unsealed(data, size, name)
    try:
        reason = message[_NOT_MASTER_HEAD.size :].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"the {name} reason is not UTF-8") from None
    # (Shown to an operator: nothing that could move a terminal's cursor.)
    return "".join(c if c.isprintable() else "?" for c in reason), size


def encode_not_master(reason: str) -> bytes:
    """
    The NOT_MASTER message saying C{reason} (cut to the limit, at a
    character boundary).
    """
    return _encode_reason(NOT_MASTER, reason, MAX_NOT_MASTER_REASON)


def decode_not_master(data: bytes | bytearray) -> tuple[str, int] | None:
    """
    The reason at the start of C{data} (which starts with the NOT_MASTER
    code) and the bytes it took, or C{None} until the message is whole.

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: the length is impossible, or the text not UTF-8.
    """
    return _decode_reason(data, NOT_MASTER, "NOT_MASTER", MAX_NOT_MASTER_REASON)


# -- group authentication (an rmqha extension for failover, docs/protocol.md) --
#
# In a failover group with a shared secret, every HA connection between
# members (replication and control alike) starts with a mutual HMAC-SHA256
# challenge-response, before anything else is sent or acted on:
#
#     slave  -> master   AUTH_HELLO      its node id, its nonce
#     master -> slave    AUTH_CHALLENGE  its node id, its nonce, its MAC
#     slave  -> master   AUTH_PROOF      its MAC, then what it sends first
#                                        (PROBE, or CHECKED_HELLO and a report)
#     master -> slave    AUTH_ACCEPTED   then its answers; or AUTH_REFUSED,
#                                        and it closes
#
# The MACs themselves are computed in rmqha.ha.auth.  Only a slave
# configured with the group's secret sends AUTH_HELLO, and only to a
# failover peer: a RocketMQ master never sees it.  A master with a secret
# says so to unauthenticated probes with FEATURE_GROUP_AUTH in its INFO.

#: Slave to master: code, id length (uint16), id (UTF-8), 32-byte nonce, CRC-32.
AUTH_HELLO = -0x524D514841_0009
#: Master to slave: code, id length (uint16), id, 32-byte nonce, 32-byte
#: HMAC-SHA256, CRC-32.
AUTH_CHALLENGE = -0x524D514841_000A
#: Slave to master: code, 32-byte HMAC-SHA256, CRC-32 (44 bytes).
AUTH_PROOF = -0x524D514841_000B
#: Master to slave, 8 bytes: the slave's proof holds.
AUTH_ACCEPTED = -0x524D514841_000C
#: Master to slave, 8 bytes, then the master closes: the slave's hello or
#: proof was refused (the master's log says why).
AUTH_REFUSED = -0x524D514841_000D
#: The control INFO feature bit of a master that requires group
#: authentication (it has the group's secret).
FEATURE_GROUP_AUTH = 8
AUTH_NONCE_SIZE = 32
AUTH_MAC_SIZE = 32
AUTH_PROOF_SIZE = 8 + AUTH_MAC_SIZE + 4


class AuthHello(NamedTuple):
    """
    A slave's AUTH_HELLO.
    """

    node_id: str
    nonce: bytes


class AuthChallenge(NamedTuple):
    """
    A master's AUTH_CHALLENGE.
    """

    node_id: str
    nonce: bytes
    mac: bytes


def _check_size(value: bytes, size: int, what: str) -> None:
    if len(value) != size:
        raise ValueError(f"{what} of {len(value)} bytes; it must be {size}")


def encode_auth_hello(node_id: str, nonce: bytes) -> bytes:
    """
    @raise ValueError: an impossible id, or a nonce that is not 32 bytes.
    """
    _check_size(nonce, AUTH_NONCE_SIZE, "nonce")
    return _sealed(_REPORT.pack(AUTH_HELLO) + _encode_id(node_id, "node id") + nonce)


def decode_auth_hello(data: bytes | bytearray) -> tuple[AuthHello, int] | None:
    """
    The AUTH_HELLO at the start of C{data} and the bytes it took, or
    C{None} until it is whole (at most 301 bytes).

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: not AUTH_HELLO, or an impossible id.
    """
    found = _decode_with_id(data, AUTH_HELLO, "AUTH_HELLO", AUTH_NONCE_SIZE)
    if found is None:
        return None
    node_id, nonce, size = found
    return AuthHello(node_id, nonce), size


def encode_auth_challenge(node_id: str, nonce: bytes, mac: bytes) -> bytes:
    """
    @raise ValueError: an impossible id, or a nonce or MAC that is not 32 bytes.
    """
    _check_size(nonce, AUTH_NONCE_SIZE, "nonce")
    _check_size(mac, AUTH_MAC_SIZE, "MAC")
    return _sealed(_REPORT.pack(AUTH_CHALLENGE) + _encode_id(node_id, "node id") + nonce + mac)


def decode_auth_challenge(data: bytes | bytearray) -> tuple[AuthChallenge, int] | None:
    """
    The AUTH_CHALLENGE at the start of C{data} and the bytes it took, or
    C{None} until it is whole (at most 333 bytes).

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: not AUTH_CHALLENGE, or an impossible id.
    """
    found = _decode_with_id(data, AUTH_CHALLENGE, "AUTH_CHALLENGE", AUTH_NONCE_SIZE + AUTH_MAC_SIZE)
    if found is None:
        return None
    node_id, tail, size = found
    return AuthChallenge(node_id, tail[:AUTH_NONCE_SIZE], tail[AUTH_NONCE_SIZE:]), size


def encode_auth_proof(mac: bytes) -> bytes:
    """
    @raise ValueError: a MAC that is not 32 bytes.
    """
    _check_size(mac, AUTH_MAC_SIZE, "MAC")
    return _sealed(_REPORT.pack(AUTH_PROOF) + mac)


def decode_auth_proof(data: bytes | bytearray) -> tuple[bytes, int] | None:
    """
    The MAC of the AUTH_PROOF at the start of C{data} and the bytes it
    took (L{AUTH_PROOF_SIZE}), or C{None} until it is whole.

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: not AUTH_PROOF.
    """
    if len(data) < 8:
        return None
    code = _REPORT.unpack_from(data)[0]
    if code != AUTH_PROOF:
        raise ProtocolError(f"code {code} is not AUTH_PROOF")
    if len(data) < AUTH_PROOF_SIZE:
        return None
    return _unsealed(data, AUTH_PROOF_SIZE, "AUTH_PROOF")[8:], AUTH_PROOF_SIZE


# -- CLOSING: a master's last words (docs/protocol.md) ------------------------
#
# A master about to close a connection to an rmqha slave says why first:
# its commit log is damaged, or the bytes the slave needs cannot be read.
# Sent in place of a frame header on a checked-framing replication
# connection, and in place of an answer in a control session: never to a
# RocketMQ slave, which asks for neither.

#: Master to slave, then it closes: code, text length (uint16), the text in
#: UTF-8 (at most MAX_CLOSING_TEXT bytes), CRC-32: NOT_MASTER's layout.
CLOSING = -0x524D514841_000E
#: The longest CLOSING text, in UTF-8 bytes (longer ones are cut).
MAX_CLOSING_TEXT = 1024

_CLOSING_HEAD = struct.Struct(">qH")
_CLOSING_CODE = _REPORT.pack(CLOSING)


class MasterClosing(ProtocolError):
    """
    The master said why it closes the connection (CLOSING).

    @ivar reason: its text.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the master closed the connection: {reason}")
        self.reason = reason


def encode_closing(reason: str) -> bytes:
    """
    The CLOSING message saying C{reason} (cut to L{MAX_CLOSING_TEXT} bytes
    of UTF-8, at a character boundary).
    """
    return _encode_reason(CLOSING, reason, MAX_CLOSING_TEXT)


def is_closing(data: bytes | bytearray | memoryview) -> bool:
    """
    Whether C{data} starts with the CLOSING code (at least 8 bytes).
    """
    return bytes(data[:8]) == _CLOSING_CODE


def decode_closing(data: bytes | bytearray) -> tuple[str, int] | None:
    """
    The text of the CLOSING at the start of C{data} (which starts with its
    code) and the bytes it took, or C{None} until it is whole.

    @raise ChecksumError: the message was damaged.
    @raise ProtocolError: the length is impossible or the text not UTF-8.
    """
    return _decode_reason(data, CLOSING, "CLOSING", MAX_CLOSING_TEXT)


# -- epochs (an rmqha extension for failover, docs/protocol.md) ---------------
#
# A failover slave asks its master, in the control session, for the
# master's epoch list, to cut its own log back to the newest epoch both
# share before replicating (docs/failover.md).  Asked only of a master
# whose INFO offered FEATURE_EPOCHS: a RocketMQ master never sees it.

#: Request: code, 0, 0, CRC (28 bytes, DIGEST's layout); answer: a head
#: (code, current epoch, max offset, count (int32), CRC-32 of the head),
#: then count x (epoch, start offset) and a CRC-32 of the entries (36 + 16
#: x count bytes).  The head has its own CRC so that a damaged count is
#: caught before any entry is waited for.
CONTROL_EPOCHS = -0x524D514841_0008
#: The control INFO feature bit of a master that keeps an epoch file.
FEATURE_EPOCHS = 4
#: The most entries an epoch list may hold (on the wire and on disk).
MAX_EPOCH_ENTRIES = 4096

_EPOCHS_HEAD = struct.Struct(">qqqi")
_EPOCH_ENTRY = struct.Struct(">qq")


class EpochsAnswer(NamedTuple):
    """
    A master's answer to EPOCHS.
    """

    #: Its current epoch (0: none).
    epoch: int
    #: Its max offset.
    max_offset: int
    #: Its epoch list, C{(epoch, start offset)}, oldest first.
    entries: list[tuple[int, int]]


def encode_epochs_request() -> bytes:
    return _sealed(_CONTROL_REQUEST.pack(CONTROL_EPOCHS, 0, 0))


def decode_control_request(data: bytes | bytearray) -> tuple[int, int, int]:
    """
    C{(code, start, end)} of the control request at the start of C{data}
    (L{CONTROL_REQUEST_SIZE} bytes): DIGEST or EPOCHS.

    @raise ChecksumError: the request was damaged.
    @raise ProtocolError: it is neither.
    """
    code, start, end = _CONTROL_REQUEST.unpack(
        _unsealed(data, CONTROL_REQUEST_SIZE, "control request")
    )
    if code not in (CONTROL_DIGEST, CONTROL_EPOCHS):
        raise ProtocolError(f"control request code {code} is neither DIGEST nor EPOCHS")
    return code, start, end


def encode_epochs_answer(epoch: int, max_offset: int, entries: list[tuple[int, int]]) -> bytes:
    """
    @raise ValueError: more than L{MAX_EPOCH_ENTRIES} entries.
    """
    if len(entries) > MAX_EPOCH_ENTRIES:
        raise ValueError(f"{len(entries)} epoch entries; the limit is {MAX_EPOCH_ENTRIES}")
    return _sealed(_EPOCHS_HEAD.pack(CONTROL_EPOCHS, epoch, max_offset, len(entries))) + _sealed(
        b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in entries)
    )


def decode_epochs_answer(data: bytes | bytearray) -> tuple[EpochsAnswer, int] | None:
    """
    The EPOCHS answer at the start of C{data} and the bytes it took, or
    C{None} until it is whole (its head, CRC and count, is checked as
    soon as it is here, before waiting for the entries).

    @raise ChecksumError: the answer was damaged.
    @raise ProtocolError: not an EPOCHS answer, too many entries, or an
        impossible list (epochs and starts must grow, the current epoch
        be the newest, the max offset past the last start).
    """
    head_size = _EPOCHS_HEAD.size + 4
    if len(data) < head_size:
        return None
    code = _REPORT.unpack_from(data)[0]
    if code != CONTROL_EPOCHS:
        raise ProtocolError(f"control answer code {code} is not EPOCHS")
    _, epoch, max_offset, count = _EPOCHS_HEAD.unpack(
        _unsealed(data, head_size, "control EPOCHS answer head")
    )
    if not 0 <= count <= MAX_EPOCH_ENTRIES:
        raise ProtocolError(f"EPOCHS answer of {count} entries; the limit is {MAX_EPOCH_ENTRIES}")
    size = head_size + count * _EPOCH_ENTRY.size + 4
    if len(data) < size:
        return None
    body = _unsealed(data[head_size:], size - head_size, "control EPOCHS answer entries")
    entries = [_EPOCH_ENTRY.unpack_from(body, i * _EPOCH_ENTRY.size) for i in range(count)]
    if epoch < 0 or max_offset < 0:
        raise ProtocolError(f"EPOCHS answer is impossible: epoch {epoch}, max offset {max_offset}")
    previous = (0, -1)
    for e, start in entries:
        if not (e > previous[0] and start > previous[1]):
            raise ProtocolError(
                f"EPOCHS answer is impossible: entry epoch {e} start {start} after "
                f"epoch {previous[0]} start {previous[1]} (both must grow)"
            )
        previous = (e, start)
    if entries and (epoch < previous[0] or max_offset < previous[1]):
        raise ProtocolError(
            f"EPOCHS answer is impossible: current epoch {epoch} and max offset "
            f"{max_offset} are before the last entry (epoch {previous[0]} start {previous[1]})"
        )
    return EpochsAnswer(epoch, max_offset, [(int(e), int(s)) for e, s in entries]), size


class Greeting(enum.Enum):
    """
    What the first 8 bytes a master receives on its HA port say the peer
    is (L{sniff_greeting}).
    """

    #: A slave's first report (RocketMQ's or rmqha's): classic framing.
    CLASSIC = "classic report"
    #: An rmqha slave asking for checked framing (CHECKED_HELLO).
    CHECKED = "checked hello"
    #: An rmqha control session (CONTROL_PROBE or CONTROL_HELLO).
    CONTROL = "control hello"
    #: An rmqha slave declaring its replica id (IDENTIFY, then a greeting).
    IDENTIFY = "identify"
    #: A failover group member proving its node id (AUTH_HELLO, then the
    #: handshake, then a greeting).
    AUTH = "group authentication"
    #: A negative value no code of ours: damaged, or an unknown peer.
    REFUSED = "refused"


def sniff_greeting(head: bytes | bytearray) -> tuple[Greeting, int] | None:
    """
    The kind of peer C{head} (the first bytes received) comes from and its
    first 8-byte value, or C{None} until 8 bytes have come.  RocketMQ
    slaves never send a negative value, so every rmqha greeting is one.
    """
    if len(head) < 8:
        return None
    code = int.from_bytes(head[:8], "big", signed=True)
    if code >= 0:
        return Greeting.CLASSIC, code
    if code == CHECKED_HELLO:
        return Greeting.CHECKED, code
    if code in (CONTROL_PROBE, CONTROL_HELLO):
        return Greeting.CONTROL, code
    if code == IDENTIFY:
        return Greeting.IDENTIFY, code
    if code == AUTH_HELLO:
        return Greeting.AUTH, code
    return Greeting.REFUSED, code
