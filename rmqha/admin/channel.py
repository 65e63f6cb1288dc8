# -*- test-case-name: tests.test_admin -*-
"""
The admin port's HTTP layer, bounded for a peer nobody has authenticated
(the port may be reachable by anyone): a body over L{MAX_REQUEST_BODY} is
refused by its C{Content-Length} before a byte of it is read, a chunked
body is cut off as it passes the limit, bodies are kept in memory (never a
temp file), the request line and headers must arrive within
L{HEADER_TIMEOUT} seconds however slowly they trickle, and a TLS client
whose certificate C{--http-allowed-peers} refuses is answered 403 before
its body is read.

    L{AdminRequest}   a request counting its body into memory; its own
                      failures answer JSON
    L{AdminChannel}   HTTP/1.1 with those limits; the errors it answers
                      itself are JSON too
    L{AdminSite}      the C{Site} making them (L{rmqha.admin.service.make_site}
                      builds the one the broker serves)
"""

from __future__ import annotations

import json
import os
from io import BytesIO
from typing import Any, Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES, HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from rmqha.logfile import (
    DEFAULT_LOG_KEEP,
    DEFAULT_LOG_ROTATE_SIZE,
    LogFileSettings,
    open_log_file,
    rotate_on_usr1,
)
from rmqha.store._record import DEFAULT_MAX_MESSAGE_SIZE
from rmqha.tls import PeerPolicy

__all__ = [
    "AdminRequest",
    "AdminChannel",
    "AdminSite",
    "MAX_REQUEST_BODY",
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
]

#: The largest request body read: RocketMQ's maxMessageSize (4 MiB) plus
#: room, so that a body a little too large is still read and refused by
#: the store with the limit named (400 MESSAGE_ILLEGAL), and anything
#: larger is refused unread (413).
MAX_REQUEST_BODY = DEFAULT_MAX_MESSAGE_SIZE + 64 * 1024
#: Seconds in which a request line and its headers must arrive, counted
#: from the connection (or the previous answer): trickling them a byte at
#: a time does not extend it.
HEADER_TIMEOUT = 10.0
#: Seconds a connection may stay silent (between requests, or in a body).
IDLE_TIMEOUT = 60.0


def _raw_error(code: int, status: str, error: str) -> bytes:
    """
    A whole HTTP/1.1 answer closing the connection, for errors found
    before there is a request to answer through (the channel's own).
    """
    body = json.dumps({"status": status, "error": error}).encode() + b"\n"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n"
        % (code, RESPONSES.get(code, b"Error"), len(body))
    ) + body


class AdminRequest(Request):
    """
    A request whose body is kept in memory and counted as it arrives (the
    channel has refused anything declared larger than its limit), and
    whose unexpected failures answer JSON, not an HTML traceback page.
    """

    _body_size = 0

    def gotLength(self, length: int | None) -> None:
        # Twisted spools bodies of 100 kB or more to a temporary file; ours
        # are bounded by the channel, so memory it is.
        self.content = BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        channel: Any = self.channel
        if channel is None or getattr(channel, "refused", False):
            return
        self._body_size += len(data)
        limit = getattr(channel, "max_body", None)
        if limit is not None and self._body_size > limit:
            channel.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body exceeds the limit of {limit} bytes",
            )
            return
        assert self.content is not None
        self.content.write(data)

    def processingFailed(self, reason: Failure) -> None:
        self._log.failure("admin request {uri} failed", reason, uri=self.uri)
        body = json.dumps(
            {"status": "UNKNOWN_ERROR", "error": "internal error (logged)"}
        ).encode() + b"\n"
        self.setResponseCode(500)
        self.setHeader(b"content-type", b"application/json")  # type: ignore[no-untyped-call]
        self.setHeader(b"content-length", b"%d" % len(body))  # type: ignore[no-untyped-call]
        self.write(body)  # type: ignore[no-untyped-call]
        self.finish()  # type: ignore[no-untyped-call]


class AdminChannel(HTTPChannel):
    """
    HTTP/1.1 with the admin port's limits: bodies by L{max_body}, request
    heads by L{header_timeout} (total, not idle), and every error it
    answers itself in JSON.

    @ivar refused: this connection was answered with an error and is
        closing; what it still sends is ignored.
    """

    _log = Logger()
    max_body = MAX_REQUEST_BODY
    header_timeout: float | None = HEADER_TIMEOUT
    refused = False
    #: What a TLS client's certificate must satisfy (its allowlist).
    peer_policy: PeerPolicy | None = None
    _peer_allowed = False
    _header_call: IDelayedCall | None = None

    def connectionMade(self) -> None:
        HTTPChannel.connectionMade(self)
        self._await_headers()

    def dataReceived(self, data: bytes) -> None:
        if not self.refused:
            HTTPChannel.dataReceived(self, data)

    def _await_headers(self) -> None:
        self._stop_header_timer()
        if self.header_timeout:
            self._header_call = self.callLater(  # type: ignore[no-untyped-call]
                self.header_timeout, self._headers_too_slow
            )

    def _stop_header_timer(self) -> None:
        if self._header_call is not None:
            if self._header_call.active():
                self._header_call.cancel()
            self._header_call = None

    def _headers_too_slow(self) -> None:
        self._header_call = None
        if not self.requests and not self._buffer:
            # Not a byte of a request: a quiet (kept-alive) connection is
            # closed without an answer nobody asked for.
            self._close()
            return
        self._log.info(
            "admin HTTP: no complete request head from {peer} within {timeout} s",
            peer=self._peer(),
            timeout=self.header_timeout,
        )
        self.refuse(
            408,
            "REQUEST_TIMEOUT",
            f"the request line and headers did not arrive within {self.header_timeout:g} s",
        )

    def headerReceived(self, line: bytes) -> bool:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and len(value.strip()) > 18:
            # Twisted would int() thousands of digits (a ValueError past
            # 4300); no body this long is taken anyway.
            self.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body is over {self.max_body} bytes (a "
                f"{len(value.strip())}-digit Content-Length)",
            )
            return False
        ok: bool = HTTPChannel.headerReceived(self, line)
        return ok

    def allHeadersReceived(self) -> None:
        self._stop_header_timer()
        refusal = self._peer_refusal()
        if refusal is not None:
            self._log.warn(
                "admin HTTP: refused {peer}: {why}",
                peer=self._peer(),
                why=refusal,
            )
            self.refuse(403, "FORBIDDEN", f"this client is not allowed here: {refusal}")
            return
        if self.length is not None and self.length > self.max_body:
            # Before a byte of the body is read (and before "100 Continue").
            self.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body is {self.length} bytes; the limit is {self.max_body}",
            )
            return
        HTTPChannel.allHeadersReceived(self)

    def _peer(self) -> str:
        address = self.transport.getPeer() if self.transport is not None else None
        host, port = getattr(address, "host", None), getattr(address, "port", None)
        return f"{host}:{port}" if host is not None else str(address)

    def _peer_refusal(self) -> str | None:
        """
        Why the TLS client certificate is refused by C{--http-allowed-peers}
        (checked once per connection, before any body is read), if it is.
        """
        policy = self.peer_policy
        if policy is None or policy.allowed_peers is None or self._peer_allowed:
            return None
        get_certificate = getattr(self.transport, "getPeerCertificate", None)
        x509 = get_certificate() if get_certificate is not None else None
        certificate = x509.to_cryptography() if x509 is not None else None
        _, refusal = policy.check(certificate)
        self._peer_allowed = refusal is None
        return refusal

    def allContentReceived(self) -> None:
        if not self.refused:
            HTTPChannel.allContentReceived(self)

    def requestDone(self, request: Any) -> None:
        if self.persistent:
            # Armed before the next request's buffered bytes are parsed.
            self._await_headers()
        HTTPChannel.requestDone(self, request)

    def lineLengthExceeded(self, line: bytes) -> None:
        self.refuse(
            400, "BAD_REQUEST", f"a request or header line is longer than {self.MAX_LENGTH} bytes"
        )

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._receivedHeaderSize > self.totalHeadersSize:
            why = f"the request line and headers exceed {self.totalHeadersSize} bytes"
        else:
            why = "malformed HTTP request"
        self.refuse(400, "BAD_REQUEST", why)

    def refuse(self, code: int, status: str, error: str) -> None:
        """
        Answer C{code} with a JSON error and close the connection, reading
        nothing more (and aborting it if the peer does not let it close).
        """
        if self.refused:
            return
        assert self.transport is not None
        self.transport.write(_raw_error(code, status, error))
        self._close()

    def _close(self) -> None:
        self.refused = True
        self._stop_header_timer()
        self.loseConnection()  # type: ignore[no-untyped-call]
        if self.abortTimeout is not None and self._abortingCall is None:
            self._abortingCall = self.callLater(  # type: ignore[no-untyped-call]
                self.abortTimeout, self.forceAbortClient
            )

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._stop_header_timer()
        HTTPChannel.connectionLost(self, reason)


class AdminSite(Site):
    """
    The admin C{Site}: L{AdminChannel}s (HTTP/1.1 only) making
    L{AdminRequest}s, with no access log unless asked for.

    @ivar access_log: the access log's path (a line per request, Twisted's
        Combined Log Format), or C{None}: none.
    """

    protocol = AdminChannel  # type: ignore[assignment]
    requestFactory = AdminRequest
    _stop_rotating: Callable[[], None] | None = None

    def __init__(
        self,
        resource: Resource,
        reactor: IReactorTime | None,
        max_body: int,
        header_timeout: float | None,
        idle_timeout: float | None,
        peer_policy: PeerPolicy | None,
        *,
        access_log: str | None = None,
    ) -> None:
        # A body is the message, whatever its type: never parsed as a form
        # into the query's arguments (C{curl -d}'s default type would let a
        # body C{queueId=5} choose the queue), and its C{Content-Type} never
        # parsed for that (the C{email} package's parser: ~15 % of a put).
        Site.__init__(
            self,
            resource,
            timeout=idle_timeout,
            reactor=reactor,
            logPath=access_log,
            parsePOSTFormSubmission=False,
        )
        self.access_log = self.logPath
        self.max_body = max_body
        self.header_timeout = header_timeout
        self.peer_policy = peer_policy
        self.noisy = False

    def startFactory(self) -> None:
        # Off, neither a log file nor the once-a-second timestamp timer
        # that HTTPFactory keeps for it (so no line is written: log()
        # finds no file).
        if self.access_log:
            Site.startFactory(self)

    def _openLogFile(self, path: str | bytes) -> Any:
        """
        The access log: rotated by size as the broker's C{--log-file} (10
        MiB, 10 files kept), and by SIGUSR1.

        @raise ValueError: it cannot be opened, naming C{--access-log}.
        """
        log_file = open_log_file(
            LogFileSettings(os.fsdecode(path), DEFAULT_LOG_ROTATE_SIZE, DEFAULT_LOG_KEEP),
            "--access-log",
        )
        call = getattr(self.reactor, "callFromThread", None)
        self._stop_rotating = rotate_on_usr1(log_file, call or (lambda f: f()))
        return log_file

    def stopFactory(self) -> None:
        if self._stop_rotating is not None:
            self._stop_rotating()
            self._stop_rotating = None
        Site.stopFactory(self)

    def buildProtocol(self, addr: Any) -> Any:
        channel = Site.buildProtocol(self, addr)
        channel.max_body = self.max_body
        channel.header_timeout = self.header_timeout
        channel.peer_policy = self.peer_policy
        return channel
