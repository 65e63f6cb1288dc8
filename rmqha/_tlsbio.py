# -*- test-case-name: tests.test_tlsbio -*-
"""
Twisted's memory-BIO TLS layer, with fewer Python steps per byte.

Twisted's L{TLSMemoryBIOProtocol} encrypts a write one 16 KiB TLS record
at a time, copying a slice of the plaintext for each, and after every
record reads the memory BIO and writes that record to the socket's
transport; on the way in it hands the application one record's plaintext
(16 KiB: OpenSSL's C{SSL_read} returns at most one record) per
C{dataReceived}.  For replication (256 KiB catch-up frames) that is a
Python loop of a dozen calls per record on both sides, and every piece
goes through the protocol's per-read work (decoding, appending, a
report).

L{TLSProtocol} changes only how the bytes move, not what they are:

    - a write is encrypted in one C{SSL_write} (pyOpenSSL's partial-write
      mode cleared: one call for all its records), drained from the BIO
      in one read sized from the plaintext, and goes to the socket in
      one write (L{send_now}: at once when Twisted holds nothing for it);
    - C{writeSequence} (what L{send_now} calls: a frame header and its
      body, a report) is sent at once, the header sharing the body's
      first record; a plain C{write} keeps Twisted's aggregation of small
      writes until the end of the reactor turn (flushed first, so order
      is kept);
    - the plaintext of all the records one socket read completed is
      decrypted into one per-connection buffer (C{SSL_read} through
      pyOpenSSL's bindings, public C{recv} without them) and handed over
      in one C{dataReceived} (at most what that read carried).

Everything else is Twisted's: the handshake, producer pauses (a write the
TLS layer cannot take yet is buffered and pauses the producer, as
before), shutdown and error reporting, C{failVerification}.
L{TLSFactory} builds it; L{rmqha.tls} uses it for the HA and admin
ports' server endpoints and the slave's client endpoint, and
L{rmqha.testing.connect_in_memory} for in-memory TLS.  Twisted itself is
not patched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from OpenSSL import SSL
from OpenSSL.SSL import Error, WantReadError, ZeroReturnError
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import (
    BufferingTLSTransport,
    TLSMemoryBIOFactory,
    TLSMemoryBIOProtocol,
)
from twisted.python.failure import Failure

from rmqha._sockets import send_now

__all__ = ["TLSProtocol", "TLSFactory"]

#: A TLS record's plaintext at most (C{SSL_read} returns one record).
_RECORD = 1 << 14
#: What a record adds at most (header, nonce, tag, padding: TLS 1.2 with
#: CBC pays the most), and slack for alerts or a key update in the BIO.
_RECORD_OVERHEAD = 256
_SLACK = 1 << 12


class TLSProtocol(BufferingTLSTransport):
    """
    L{BufferingTLSTransport} encrypting each write in one pass and handing
    over each socket read's plaintext whole (see the module docstring).
    """

    _received = 0
    _plaintext: Any = None

    def makeConnection(self, transport: Any) -> None:
        BufferingTLSTransport.makeConnection(self, transport)
        _whole_writes(self._tlsConnection)

    def writeSequence(self, sequence: Iterable[bytes]) -> None:
        """
        Send C{sequence} now, not at the end of the reactor turn: what
        L{rmqha._sockets.send_now} calls (a frame, a report a SYNC_MASTER
        waits for).  Small chunks are joined into one record; C{write}
        keeps Twisted's aggregation of small writes.
        """
        chunks = list(sequence)
        # What the aggregation holds goes first.
        self._aggregator.flush()
        if self.disconnecting and self._producer is None:
            return
        if sum(len(c) for c in chunks) < _RECORD:
            chunks = [b"".join(chunks)]
        elif len(chunks) > 1 and len(chunks[0]) < _RECORD:
            # A frame header shares the first record with its body (one
            # 16 KiB copy, not a record of its own).
            head, body = chunks[0], memoryview(chunks[1])
            take = _RECORD - len(head)
            chunks = [head + body[:take], body[take:], *chunks[2:]]  # type: ignore[list-item]
        self._send(chunks)

    def _write(self, bytes: Any) -> None:
        self._send([bytes])

    def _send(self, chunks: list[Any]) -> None:
        """
        Encrypt C{chunks} record by record from views of them, then move
        all the records to the transport at once.  What OpenSSL cannot
        take before it reads (renegotiation) waits in C{_appSendBuffer}
        (the producer is paused) and an error ends the connection, as in
        Twisted.
        """
        if self._lostTLSConnection:
            return
        send = self._tlsConnection.send
        total = 0
        for i, chunk in enumerate(chunks):
            view = memoryview(chunk)
            size = len(view)
            sent = 0
            while sent < size:
                try:
                    n = send(view[sent:])
                except WantReadError:
                    self._drain(total)
                    TLSMemoryBIOProtocol._bufferedWrite(
                        self, b"".join([view[sent:], *chunks[i + 1 :]])
                    )
                    return
                except Error:
                    self._drain(total)
                    TLSMemoryBIOProtocol._tlsShutdownFinished(self, Failure())
                    return
                sent += n
                total += n
        self._drain(total)

    def _drain(self, plaintext: int) -> None:
        """
        Write everything in the send BIO to the transport, in one write:
        read in one call sized for C{plaintext} bytes' records.
        """
        want = plaintext + (plaintext // _RECORD + 1) * _RECORD_OVERHEAD + _SLACK
        read = self._tlsConnection.bio_read
        try:
            data = read(want)
        except WantReadError:
            return
        if len(data) == want:
            pieces = [data]
            while True:
                try:
                    data = read(want)
                except WantReadError:
                    break
                pieces.append(data)
                if len(data) < want:
                    break
            data = b"".join(pieces)
        send_now(self.transport, [data])

    def _flushSendBIO(self) -> None:
        self._drain(0)

    def dataReceived(self, bytes: Any) -> None:
        # (The plaintext of this read is at most its ciphertext plus what
        # the BIO held of a record cut by the previous read.)
        self._received = len(bytes)
        BufferingTLSTransport.dataReceived(self, bytes)

    def _flushReceiveBIO(self) -> None:
        """
        Decrypt every record the BIO holds and deliver their plaintext in
        one C{dataReceived}; then, as in Twisted, handle a close or an
        error that ended the loop, and send what OpenSSL wants sent.
        """
        if _DIRECT is not None:
            data, closed, ended = self._decrypt_direct()
        else:
            data, closed, ended = self._decrypt()
        if data and not self._aborted:
            ProtocolWrapper.dataReceived(self, data)
        if closed:
            # TLS has shut down: no more data comes on this connection.
            TLSMemoryBIOProtocol._shutdownTLS(self)
            TLSMemoryBIOProtocol._tlsShutdownFinished(self, None)
        elif ended is not None:
            TLSMemoryBIOProtocol._tlsShutdownFinished(self, ended)
        self._drain(0)

    def _decrypt(self) -> tuple[bytes, bool, Failure | None]:
        """
        Every record's plaintext, through pyOpenSSL's public C{recv} (one
        call, one allocation and one copy per record, then a join).

        @return: the plaintext, whether TLS was shut down (close_notify),
            and the failure that ended decryption, if one did.
        """
        recv = self._tlsConnection.recv
        pieces = []
        while not self._lostTLSConnection:
            try:
                pieces.append(recv(_RECORD))
            except WantReadError:
                break
            except ZeroReturnError:
                return b"".join(pieces), True, None
            except Error:
                return b"".join(pieces), False, Failure()
        return b"".join(pieces), False, None

    def _decrypt_direct(self) -> tuple[bytes, bool, Failure | None]:
        """
        L{_decrypt} with C{SSL_read} called through pyOpenSSL's bindings
        into one buffer: no Python object per record, one copy out.  A
        call that returns nothing is classified by pyOpenSSL itself
        (C{_raise_ssl_error}, what its C{recv} calls), so errors read as
        they do through C{recv}.
        """
        assert _DIRECT is not None
        ssl_read, allocate, copy = _DIRECT
        connection = self._tlsConnection
        handle = connection._ssl
        size = self._received + 2 * (_RECORD + _RECORD_OVERHEAD)
        self._received = 0
        # One buffer per connection, as large as its largest read: a fresh
        # one would fault its pages in on every read.
        buffer = self._plaintext
        if buffer is None or len(buffer) < size:
            buffer = self._plaintext = allocate("char[]", size)
        size = len(buffer)
        position = 0
        pieces = []
        closed, ended = False, None
        while not self._lostTLSConnection:
            if size - position < _RECORD:
                # (Not expected: plaintext is never longer than ciphertext.)
                pieces.append(copy(buffer, position)[:])
                position = 0
            result = ssl_read(handle, buffer + position, size - position)
            if result > 0:
                position += result
                continue
            try:
                connection._raise_ssl_error(handle, result)
            except WantReadError:
                pass
            except ZeroReturnError:
                closed = True
            except Error:
                ended = Failure()
            break
        data = copy(buffer, position)[:]
        if pieces:
            data = b"".join([*pieces, data])
        return data, closed, ended


def _whole_writes(connection: Any) -> None:
    """
    Let one C{SSL_write} encrypt a whole write into the memory BIO (all
    its records), instead of returning after the first record: pyOpenSSL
    sets C{SSL_MODE_ENABLE_PARTIAL_WRITE} on every connection, and each
    of its C{send} calls costs microseconds of Python, sixteen times per
    256 KiB.  A memory BIO never refuses bytes, so a write is only cut
    short by a renegotiation (C{WantReadError}); OpenSSL then wants the
    same bytes again, which is what L{TLSProtocol._send} buffers.  pyOpenSSL
    has no public call for a connection's mode: without its bindings the
    connection keeps partial writes (correct, slower).
    """
    lib = getattr(SSL, "_lib", None)
    ssl = getattr(connection, "_ssl", None)
    clear = getattr(lib, "SSL_clear_mode", None)
    mode = getattr(lib, "SSL_MODE_ENABLE_PARTIAL_WRITE", None)
    if ssl is not None and clear is not None and mode is not None:
        clear(ssl, mode)


def _direct_reads() -> tuple[Any, Any, Any] | None:
    """
    C{(SSL_read, allocate, buffer)} from pyOpenSSL's bindings, when they
    are there (they are not public API): else C{None}, and records are
    read through C{recv}.
    """
    lib = getattr(SSL, "_lib", None)
    ffi = getattr(SSL, "_ffi", None)
    if (
        lib is None
        or ffi is None
        or not hasattr(lib, "SSL_read")
        or not hasattr(SSL.Connection, "_raise_ssl_error")
    ):
        return None
    return lib.SSL_read, ffi.new_allocator(should_clear_after_alloc=False), ffi.buffer


_DIRECT = _direct_reads()


class TLSFactory(TLSMemoryBIOFactory):
    """
    L{TLSMemoryBIOFactory} building L{TLSProtocol}s.
    """

    protocol: type[TLSMemoryBIOProtocol] = TLSProtocol
