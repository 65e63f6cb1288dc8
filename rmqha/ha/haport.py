# -*- test-case-name: tests.test_haport -*-
"""
A failover node's HA port, held for the node's whole life (docs/failover.md,
"The HA port has an owner").

A node listens on its advertised HA port when it starts and keeps it in
every role, so that no other process can bind it while the node is a slave
or stands by (a port squatter posing as the next master, or an ordinary
port clash that would stop the node taking office).  L{HAGate} is the
port's factory: while this node is master it builds the master's
connections; otherwise each connection gets a L{NotMasterConnection}, which
answers an rmqha greeting with C{NOT_MASTER} and the reason, and closes a
classic slave's connection at once.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha._ports import OpenedLater
from rmqha.ha._wire import Greeting, encode_not_master, sniff_greeting

__all__ = ["HAGate", "NotMasterConnection", "GREETING_TIMEOUT"]

#: Seconds a connection to a node that is not the master may stay silent
#: before its greeting arrives.
GREETING_TIMEOUT = 10.0


class NotMasterConnection(Protocol):
    """
    A peer on the HA port of a node that is not the master: read its
    greeting (8 bytes, no more), answer an rmqha peer C{NOT_MASTER} with
    the reason, close.
    """

    _log = Logger()

    def __init__(self, clock: IReactorTime, why: str) -> None:
        self._clock = clock
        self._why = why
        self._head = b""
        self._timer: IDelayedCall | None = None
        self._done = False

    def connectionMade(self) -> None:
        self._timer = self._clock.callLater(GREETING_TIMEOUT, self._silent)

    def _silent(self) -> None:
        self._timer = None
        self._close()

    def dataReceived(self, data: bytes) -> None:
        if self._done:
            return
        self._head += data[: 8 - len(self._head)]
        sniffed = sniff_greeting(self._head)
        if sniffed is None:
            return
        greeting, _ = sniffed
        if greeting is not Greeting.CLASSIC:
            # An rmqha peer: it shows the reason as its problem.
            self.transport.write(encode_not_master(self._why))  # type: ignore[union-attr]
        self._close()

    def _close(self) -> None:
        self._done = True
        if self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._done = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


class HAGate(OpenedLater):
    """
    The HA port's factory for the node's whole life: the master's factory
    while this node is master (C{factory}), else L{NotMasterConnection}s
    saying C{why()}.
    """

    def __init__(self, clock: IReactorTime, why: Callable[[], str]) -> None:
        super().__init__()
        self._clock = clock
        self._why = why

    def buildProtocol(self, addr: Any) -> Any:
        factory: Factory | None = self.factory
        if factory is not None:
            return factory.buildProtocol(addr)
        protocol = NotMasterConnection(self._clock, self._why())
        protocol.factory = self
        return protocol
