# -*- test-case-name: tests.test_master -*-
"""
Writing to a TCP connection at once: L{send_now} (frames, reports and
heartbeats, on plain TCP and, beneath it, rmqha's TLS layer),
L{send_file_now} (catch-up frames whose body goes from the file; where
it can, L{sends_files}) and
L{set_tcp_no_delay}.  A leaf: imports no other rmqha module.
"""

from __future__ import annotations

import os
import socket as _socket
from typing import Any, Callable, Sequence

from twisted.internet import tcp
from twisted.protocols.policies import ProtocolWrapper

__all__ = ["send_file_now", "send_now", "sends_files", "set_tcp_no_delay"]

#: C{os.sendfile}, where there is one (Linux, the BSDs, macOS).
_sendfile = getattr(os, "sendfile", None)
#: More follows at once: the header is not pushed alone (Linux).
_MSG_MORE = getattr(_socket, "MSG_MORE", 0)


def set_tcp_no_delay(transport: object) -> None:
    """
    TCP_NODELAY, as RocketMQ sets on HA sockets: reports and small frames
    must not wait for Nagle's algorithm (a SYNC_MASTER put waits on them).
    """
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_no_delay is not None:
        set_no_delay(True)


def send_now(transport: Any, chunks: Sequence[bytes]) -> bool:
    """
    Write C{chunks}, in order.  On a plain TCP connection with nothing
    queued, they are sent at once, in one C{sendmsg} (a C{writev}), instead
    of on the reactor's next turn: a SYNC_MASTER put waits for the frame to
    reach the slave and for the slave's report to come back, and a queued
    write costs each of them a reactor turn and two C{epoll_ctl}s.  What
    the socket does not take (it is full, or failing: C{doWrite} meets the
    error then) is queued as by C{transport.writeSequence}.  Anything else
    (TLS, C{StringTransport}) gets C{writeSequence}.

    A wrapper that only forwards writes (the connection limit's
    L{ProtocolWrapper}) is looked through; one that transforms them (TLS)
    is not.

    @return: whether all of it is on the socket (C{False}: some is queued).
    """
    outer = transport
    transport = _writable_now(transport)
    if transport is not None:
        try:
            sent = transport.socket.sendmsg(chunks)
        except OSError:
            sent = 0
        return _queue_rest(transport, chunks, sent)
    outer.writeSequence(chunks)
    return False


def sends_files(transport: Any) -> bool:
    """
    Whether L{send_file_now} would send from the file on C{transport} now:
    a plain TCP connection with nothing queued, where there is
    C{sendfile}.  (Otherwise it writes C{rest(0)}: the caller might as
    well read the bytes and send them.)
    """
    return _sendfile is not None and _writable_now(transport) is not None


def send_file_now(
    transport: Any,
    header: bytes,
    fd: int,
    position: int,
    size: int,
    rest: Callable[[int], bytes],
) -> bool:
    """
    Write C{header}, then the C{size} bytes of file C{fd} from
    C{position}.  On a plain TCP connection with nothing queued the body
    goes from the file with C{sendfile} (the kernel hands the socket the
    page-cache pages: no copy into socket buffers, which was a quarter of
    a catch-up master's CPU), after the header (sent with C{MSG_MORE}, so
    that it leaves with the body).  Bytes the socket does not take are
    read, C{rest(start)} being the body from byte C{start} on, and queued
    as C{send_now} queues.  Otherwise (TLS, bytes queued already, no
    C{sendfile}) it is C{writeSequence([header, rest(0)])}.

    For frames whose header carries a CRC of the body only (checked
    framing): the bytes leave the file when the peer reads them, and the
    rest is read after the header was made, so a change to them meanwhile
    (none is made to a log's bytes below its end while it is replicated
    from) would reach the peer as a CRC mismatch, never as accepted bytes.

    @return: whether all of it is on the socket (C{False}: some is queued).
    """
    sendfile = _sendfile
    direct = _writable_now(transport) if sendfile is not None else None
    if sendfile is None or direct is None:
        transport.writeSequence([header, rest(0)])
        return False
    try:
        sent = direct.socket.send(header, _MSG_MORE)
    except OSError:
        sent = 0
    if sent < len(header):
        return _queue_rest(direct, [header, rest(0)], sent)
    try:
        sent = sendfile(direct.socket.fileno(), fd, position, size)
    except OSError:
        # (The socket full, failing — doWrite meets that — or the file
        # unreadable now: the rest goes the ordinary way.)
        sent = 0
    if sent < size:
        direct.writeSequence([rest(sent)])
        return False
    return True


def _writable_now(transport: Any) -> tcp.Connection | None:
    """
    The plain TCP connection under C{transport} when bytes can go straight
    to its socket (connected, nothing queued), else C{None}.  A wrapper
    that only forwards writes (the connection limit's L{ProtocolWrapper})
    is looked through; one that transforms them (TLS) is not.
    """
    while (
        isinstance(transport, ProtocolWrapper)
        and type(transport).write is ProtocolWrapper.write
        and type(transport).writeSequence is ProtocolWrapper.writeSequence
    ):
        transport = transport.transport
    if (
        isinstance(transport, tcp.Connection)
        and transport.connected
        and not transport.disconnecting
        and not getattr(transport, "_writeDisconnected", True)
        and getattr(transport, "_tempDataLen", None) == 0
        # (Twisted's private buffer state: if a release renames it, every
        # write takes the ordinary path.)
        and getattr(transport, "offset", None) == len(getattr(transport, "dataBuffer", b"x"))
    ):
        return transport
    return None


def _queue_rest(transport: tcp.Connection, chunks: Sequence[bytes], sent: int) -> bool:
    """
    Queue what of C{chunks} the first C{sent} bytes did not cover.

    @return: whether nothing was left to queue.
    """
    for i, chunk in enumerate(chunks):
        if sent < len(chunk):
            # (Only the chunk cut by the socket is copied.)
            transport.writeSequence([chunk[sent:], *chunks[i + 1 :]])
            return False
        sent -= len(chunk)
    return True
