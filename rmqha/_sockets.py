# -*- test-case-name: tests.test_master -*-
"""
Writing to a TCP connection at once: L{send_now} (frames, reports and
heartbeats, on plain TCP and, beneath it, rmqha's TLS layer) and
L{set_tcp_no_delay}.  A leaf: imports no other rmqha module.
"""

from __future__ import annotations

from typing import Any, Sequence

from twisted.internet import tcp
from twisted.protocols.policies import ProtocolWrapper

__all__ = ["send_now", "set_tcp_no_delay"]


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
        # write takes the ordinary path below.)
        and getattr(transport, "offset", None) == len(getattr(transport, "dataBuffer", b"x"))
    ):
        try:
            sent = transport.socket.sendmsg(chunks)
        except OSError:
            sent = 0
        for i, chunk in enumerate(chunks):
            if sent < len(chunk):
                # (Only the chunk cut by the socket is copied.)
                transport.writeSequence([chunk[sent:], *chunks[i + 1 :]])
                return False
            sent -= len(chunk)
        return True
    outer.writeSequence(chunks)
    return False
