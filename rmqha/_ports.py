# -*- test-case-name: tests.test_tap,tests.test_limits -*-
"""
Listening ports: one place that turns a Twisted server endpoint (or its
description) into a listening L{StreamServerEndpointService}, failing with
one line (L{ListenFailed}) instead of a logged traceback.
"""

from __future__ import annotations

from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.internet.protocol import Factory

__all__ = ["ListenFailed", "listen", "listened_address", "OpenedLater", "Port"]


class ListenFailed(Exception):
    """
    A port the broker serves could not be listened on (a bad endpoint
    description, the address in use, no permission).

    @ivar port: C{"ha"} or C{"http"}.
    @ivar description: the endpoint description.
    @ivar reason: one line saying why.
    """

    def __init__(self, port: str, description: str, reason: str) -> None:
        super().__init__(f"cannot listen on {description}: {reason}")
        self.port = port
        self.description = description
        self.reason = reason


def listen(
    reactor: Any, name: str, where: str | IStreamServerEndpoint, factory: Any
) -> StreamServerEndpointService:
    """
    Listen on C{where} now (C{privilegedStartService}: before twistd drops
    privileges, before the store is opened) with C{factory}; the service
    returned is named C{name} and not started.

    @raise ListenFailed: naming the port and why.
    """
    description = where if isinstance(where, str) else str(where)
    try:
        endpoint = serverFromString(reactor, where) if isinstance(where, str) else where
        service = StreamServerEndpointService(endpoint, factory)
        # Twisted's way to have a failed listen raise here, not be logged.
        service._raiseSynchronously = True
        service.privilegedStartService()
    except Exception as e:
        socket_error = getattr(e, "socketError", None)
        why = (
            socket_error.strerror
            if isinstance(socket_error, OSError) and socket_error.strerror
            else str(e) or type(e).__name__
        )
        raise ListenFailed(name, description, why) from None
    service.setName(name)
    return service


class OpenedLater(Factory):
    """
    What a port listens with before the store is open: builds the
    protocols of C{factory}, which is set when the store has opened (in
    the same C{startService} call, or under twistd before the reactor
    runs); a connection before that, or after the factory is withdrawn, is
    closed at once.
    """

    factory: Factory | None = None
    noisy = False

    def __init__(self, prefix: str = "MasterFactory") -> None:
        self._prefix = prefix

    def logPrefix(self) -> str:
        return self._prefix

    def buildProtocol(self, addr: Any) -> Any:
        if self.factory is None:
            return None  # (Twisted then closes the connection.)
        return self.factory.buildProtocol(addr)


class Port(Service):
    """
    A listening port composed into a broker (the admin interface, say):
    set it as a child of the L{rmqha.broker.Broker}, which listens on it
    (L{listen}) with its own ports, before the store is opened and behind
    the connection limiter's shared budget, then starts it after its
    role, and stops it first.

    @ivar port: the listening service, once listening.
    """

    port: StreamServerEndpointService | None = None

    def listen(self, limited: Any) -> None:
        """
        Listen now (once), wrapping the factory with C{limited(name,
        factory)}.

        @raise ListenFailed: naming the port and why.
        """
        raise NotImplementedError()

    def startService(self) -> None:
        Service.startService(self)
        if self.port is None:
            # Added to a running broker: listen now.
            self.listen(getattr(self.parent, "limited"))
        assert self.port is not None
        self.port.startService()

    def stopService(self) -> Deferred[None] | None:
        Service.stopService(self)
        port, self.port = self.port, None
        if port is None:
            return None
        stopping: Deferred[None] = port.stopService()
        return stopping

    def address(self) -> Deferred[Any]:
        """
        Fires with the address listened on (for C{tcp:0}).
        """
        assert self.port is not None
        return listened_address(self.port)


def listened_address(service: StreamServerEndpointService) -> Deferred[Any]:
    """
    A new L{Deferred} firing with the address C{service} listens on (or
    its failure to listen), leaving what the service's own C{Deferred}
    holds -- the listening port, which C{stopService} stops -- unchanged.
    (Chaining C{getHost} onto that one would leave an address there:
    C{stopService} would then fail and the port stay open.)
    """
    waiting: Deferred[Any] | None = service._waitingForPort
    assert waiting is not None
    address: Deferred[Any] = Deferred()

    def listened(port: Any) -> Any:
        address.callback(port.getHost())
        return port

    def failed(reason: Any) -> Any:
        address.errback(reason)
        return reason

    waiting.addCallbacks(listened, failed)
    return address
