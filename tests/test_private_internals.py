"""
The fast paths that lean on private internals of Twisted and pyOpenSSL
(issue 26, item 6): each falls back to slower, correct code when what it
reads is gone, so a release that renames it would only make rmqha slower,
silently.  These tests fail instead, on the versions pyproject.toml allows
(bounded above: a new release is taken deliberately, with these passing).
"""

from __future__ import annotations

from OpenSSL import SSL
from twisted.internet import abstract, tcp
from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http import HTTPChannel

from rmqha import _tlsbio


class SendNowTests(SynchronousTestCase):
    """
    L{rmqha._sockets.send_now} writes straight to the socket only when
    Twisted's TCP transport has nothing queued, read from its private
    buffer state.
    """

    def test_buffer_state_is_where_send_now_reads_it(self) -> None:
        """
        A new transport's state as send_now reads it: nothing queued
        (C{_tempDataLen} 0, C{offset} at the end of C{dataBuffer}), writes
        not disconnected.  Renamed, the fast path would be off for good.
        """
        self.assertTrue(issubclass(tcp.Connection, abstract.FileDescriptor))
        transport = abstract.FileDescriptor(reactor=MemoryReactor())
        for name, value in [
            ("_tempDataLen", 0),
            ("offset", 0),
            ("dataBuffer", b""),
            ("_writeDisconnected", False),
        ]:
            self.assertEqual(getattr(transport, name, "missing"), value, name)
        # Queued bytes show there, as send_now assumes.
        transport.connected = True
        transport.startWriting = lambda: None  # type: ignore[method-assign]
        transport.write(b"queued")
        self.assertEqual(transport._tempDataLen, 6)  # type: ignore[attr-defined]


class TLSFastPathTests(SynchronousTestCase):
    """
    L{rmqha._tlsbio} reads records with pyOpenSSL's C{SSL_read} binding
    and clears C{SSL_MODE_ENABLE_PARTIAL_WRITE}, both through pyOpenSSL's
    private C{_lib}/C{_ffi}.
    """

    def test_direct_reads_available(self) -> None:
        self.assertIsNotNone(_tlsbio._DIRECT, "pyOpenSSL's SSL_read binding is gone")

    def test_whole_writes_clears_partial_write_mode(self) -> None:
        connection = SSL.Connection(SSL.Context(SSL.TLS_METHOD), None)
        lib = SSL._lib  # type: ignore[attr-defined]
        partial = lib.SSL_MODE_ENABLE_PARTIAL_WRITE
        # (SSL_set_mode with no bits answers the connection's mode.)
        self.assertTrue(lib.SSL_set_mode(connection._ssl, 0) & partial)  # pyOpenSSL's default
        _tlsbio._whole_writes(connection)
        self.assertFalse(lib.SSL_set_mode(connection._ssl, 0) & partial)


class TLSHandshakeStateTests(SynchronousTestCase):
    """
    L{rmqha.tls.ServerTLSFactory} tells a failed handshake from a closed
    connection by Twisted's private C{_handshakeDone} and C{_reason} on
    its TLS protocol; renamed, failed handshakes would go unlogged.
    """

    def test_handshake_state_it_reads(self) -> None:
        from twisted.protocols.tls import TLSMemoryBIOProtocol

        self.assertIs(TLSMemoryBIOProtocol._handshakeDone, False)  # type: ignore[attr-defined]
        self.assertIsNone(TLSMemoryBIOProtocol._reason)  # type: ignore[attr-defined]


class AdminChannelTests(SynchronousTestCase):
    """
    The admin port's channel (L{rmqha.admin}) reads Twisted's HTTPChannel
    state to time out slow heads and name an oversized one.
    """

    def test_channel_state_it_reads(self) -> None:
        channel = HTTPChannel()
        self.assertEqual(channel._buffer, b"")  # type: ignore[attr-defined]
        self.assertEqual(channel._receivedHeaderSize, 0)  # type: ignore[attr-defined]
        self.assertIsInstance(channel.totalHeadersSize, int)
        self.assertTrue(callable(channel._respondToBadRequestAndDisconnect))


class BusyPollInternalsTests(SynchronousTestCase):
    """
    L{rmqha._busypoll} stands in for the epoll reactor's private
    C{_poller} (an C{epoll} whose C{poll(timeout, maxevents)} the reactor's
    iteration calls).
    """

    def test_epoll_reactor_polls_its_poller(self) -> None:
        import select

        from twisted.internet.epollreactor import EPollReactor

        reactor = EPollReactor()
        self.addCleanup(reactor.waker.connectionLost, None)
        self.addCleanup(reactor.removeAll)
        self.assertIsInstance(reactor._poller, select.epoll)
        self.addCleanup(reactor._poller.close)
        calls: list[tuple[float, int]] = []

        class Recording:
            def __init__(self, poller: select.epoll) -> None:
                self.poller = poller

            def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
                calls.append((timeout, maxevents))
                return self.poller.poll(0, maxevents)

        original = reactor._poller
        reactor._poller = Recording(original)
        self.addCleanup(setattr, reactor, "_poller", original)
        reactor.doIteration(0.25)
        self.assertEqual(calls, [(0.25, len(reactor._selectables))])
