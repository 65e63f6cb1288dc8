# -*- test-case-name: tests.test_limits -*-
"""
Connection bounds for every listening port (the HA port and the admin
HTTP port), and the process's descriptor limit.

Every port is reachable by an attacker, and every accepted connection
holds a file descriptor.  L{LimitedFactory} wraps a port's factory (like
Twisted's C{LimitTotalConnectionsFactory} and C{LimitConnectionsByPeer},
in one): it refuses a connection beyond C{max_connections} on the port,
beyond C{max_per_peer} from one host, or beyond the L{ConnectionBudget}
all ports share, by closing it at once, with a rate-limited log line.
The shared budget is the soft descriptor limit minus a reserve, so the
store can always open a segment file however many peers connect.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.interfaces import (
    IAddress,
    IHandshakeListener,
    IProtocolNegotiationFactory,
    IReactorTime,
)
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from zope.interface import implementer

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "FD_RESERVE",
    "ConnectionBudget",
    "LimitedFactory",
    "raise_fd_limit",
]

#: Connections one port accepts at once: far more than a broker's slaves
#: and admin clients, and 2 ports of it fit the common 1024 soft limit.
DEFAULT_MAX_CONNECTIONS = 256
#: Connections one host may hold on one port: a slave needs 2 on the HA
#: port (replication and a control session), a dashboard a few on HTTP.
DEFAULT_MAX_CONNECTIONS_PER_PEER = 16
#: Descriptors kept free for the store (segment files, the lock, the
#: queue-table snapshot), the listening sockets, logs and the thread pool.
FD_RESERVE = 64
#: Seconds between two log lines about refused connections on one port.
_REFUSAL_LOG_INTERVAL = 10.0


def raise_fd_limit(
    getrlimit: Callable[[int], tuple[int, int]] | None = None,
    setrlimit: Callable[[int, tuple[int, int]], None] | None = None,
) -> int:
    """
    Raise the soft C{RLIMIT_NOFILE} to the hard limit (Java's RocketMQ
    relies on the start script's C{ulimit -n}; a Python process gets the
    soft default, often 1024).

    @return: the soft limit now in force (the old one if raising failed).
    """
    import resource

    get = getrlimit or resource.getrlimit
    set_ = setrlimit or resource.setrlimit
    soft, hard = get(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        set_(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        Logger().warn(
            "cannot raise the open-files limit from {soft} to {hard}: {error}",
            soft=soft,
            hard=hard,
            error=e,
        )
        return soft
    Logger().info("raised the open-files limit from {soft} to {hard}", soft=soft, hard=hard)
    return hard


class ConnectionBudget:
    """
    Connections all limited ports may hold together: the descriptors left
    after the reserve.
    """

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"a connection budget of {total} leaves no connection")
        self.total = total
        self.open = 0

    @classmethod
    def for_fd_limit(cls, soft_limit: int, reserve: int = FD_RESERVE) -> "ConnectionBudget":
        return cls(max(1, soft_limit - reserve))


@implementer(IHandshakeListener)
class _Counted(ProtocolWrapper):
    """
    An accepted connection, counted until it is lost.  Transparent: the
    wrapped protocol sees the real transport's interfaces and attributes
    (L{ProtocolWrapper}), and TLS handshake notifications are passed on.
    """

    host = ""

    def makeConnection(self, transport: Any) -> None:
        factory = self.factory
        # Wrapped by another wrapper (TLS) we must always give it a
        # protocol; outermost we may refuse by returning none.
        factory.outermost = not isinstance(transport, ProtocolWrapper)
        ProtocolWrapper.makeConnection(self, transport)

    def handshakeCompleted(self) -> None:
        listener = IHandshakeListener(self.wrappedProtocol, None)
        if listener is not None:
            listener.handshakeCompleted()


class _Refused(Protocol):
    """
    A connection over a limit inside another wrapper (TLS): closed at
    once, before any handshake.
    """

    def makeConnection(self, transport: Any) -> None:
        transport.abortConnection()


@implementer(IProtocolNegotiationFactory)
class LimitedFactory(WrappingFactory[_Counted]):
    """
    A port's factory, bounded in connections per port and per host, and
    by a budget shared with the other ports.  Under TLS it offers the
    wrapped factory's application protocols for ALPN (a C{Site}'s
    C{http/1.1}), as the wrapped factory would without it.

    @ivar refused: connections refused so far.
    """

    protocol = _Counted
    _log = Logger()

    def __init__(
        self,
        wrapped: Any,
        clock: IReactorTime,
        *,
        name: str,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
        budget: ConnectionBudget | None = None,
    ) -> None:
        """
        @param name: the port, for log lines (C{"HA"}, C{"HTTP"}).
        """
        if max_connections < 1 or max_per_peer < 1:
            raise ValueError(
                f"connection limits must be at least 1 (got {max_connections} per port, "
                f"{max_per_peer} per peer)"
            )
        super().__init__(wrapped)  # type: ignore[no-untyped-call]
        self.clock = clock
        self.name = name
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.budget = budget
        self.refused = 0
        self.outermost = False
        self._count = 0
        self._per_peer: dict[str, int] = {}
        self._last_log: float | None = None
        self._unlogged = 0

    @property
    def connections(self) -> int:
        return self._count

    def acceptableProtocols(self) -> list[bytes]:
        """
        The wrapped factory's ALPN protocols (L{IProtocolNegotiationFactory}),
        or none when it names none (the TLS layer then selects nothing).
        """
        negotiating = IProtocolNegotiationFactory(self.wrappedFactory, None)
        if negotiating is None:
            return []
        return list(negotiating.acceptableProtocols())

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:  # type: ignore[override]
        host = str(getattr(addr, "host", addr))
        why = self._over_limit(host)
        if why is not None:
            self._refuse(host, why)
            return None if self.outermost else _Refused()
        wrapped = self.wrappedFactory.buildProtocol(addr)
        if wrapped is None:
            return None
        self._count += 1
        self._per_peer[host] = self._per_peer.get(host, 0) + 1
        if self.budget is not None:
            self.budget.open += 1
        protocol = self.protocol(self, wrapped)
        protocol.host = host
        return protocol

    def _over_limit(self, host: str) -> str | None:
        if self._count >= self.max_connections:
            return f"the port holds its maximum of {self.max_connections} connections"
        if self._per_peer.get(host, 0) >= self.max_per_peer:
            return f"{host} holds its maximum of {self.max_per_peer} connections"
        budget = self.budget
        if budget is not None and budget.open >= budget.total:
            return (
                f"all ports hold {budget.open} connections, the most the open-files "
                f"limit allows with {FD_RESERVE} kept for the store"
            )
        return None

    def _refuse(self, host: str, why: str) -> None:
        self.refused += 1
        now = self.clock.seconds()
        if self._last_log is not None and now - self._last_log < _REFUSAL_LOG_INTERVAL:
            self._unlogged += 1
            return
        self._log.warn(
            "{port} port refused a connection from {host}: {why}"
            " ({unlogged} more refused since the last such line)",
            port=self.name,
            host=host,
            why=why,
            unlogged=self._unlogged,
        )
        self._last_log = now
        self._unlogged = 0

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)  # type: ignore[no-untyped-call]
        self._count -= 1
        left = self._per_peer.get(p.host, 0) - 1
        if left > 0:
            self._per_peer[p.host] = left
        else:
            self._per_peer.pop(p.host, None)
        if self.budget is not None:
            self.budget.open -= 1
