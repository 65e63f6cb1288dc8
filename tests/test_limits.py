"""
Tests for L{rmqha._limits}: connection bounds on every listening port and
the open-files limit (issue 12, item 14).
"""

from __future__ import annotations

import resource
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.address import IPv4Address
from twisted.internet.defer import succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.protocols.policies import ProtocolWrapper
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha._limits import FD_RESERVE, ConnectionBudget, LimitedFactory, raise_fd_limit
from rmqha.admin import AdminService
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog

from tests._helpers import fixed_clock


def address(host: str = "10.0.0.1", port: int = 5000) -> IPv4Address:
    return IPv4Address("TCP", host, port)


class LimitedFactoryTests(SynchronousTestCase):
    """
    One limiter: per port, per peer host, and a budget shared by ports.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.made: list[Protocol] = []

    def limited(self, **kw: Any) -> LimitedFactory:
        inner = Factory.forProtocol(Protocol)
        return LimitedFactory(inner, self.clock, name="HA", **kw)

    def connect(
        self, factory: LimitedFactory, host: str = "10.0.0.1", port: int = 5000
    ) -> Any:
        """
        Accept a connection the way a listening port does; the protocol,
        or C{None} when refused by closing the socket.
        """
        protocol = factory.buildProtocol(address(host, port))
        if protocol is not None:
            protocol.makeConnection(StringTransport())
        return protocol

    def lose(self, protocol: Any) -> None:
        protocol.connectionLost(Failure(ConnectionDone()))

    def test_port_limit(self) -> None:
        """
        The connection past C{max_connections} is closed at once (no
        protocol: the listening port closes the socket); a closed
        connection frees its slot.
        """
        factory = self.limited(max_connections=2)
        first = self.connect(factory, port=1)
        self.connect(factory, "10.0.0.2", port=2)
        with capturedLogs() as events:
            self.assertIsNone(self.connect(factory, "10.0.0.3"))
        self.assertEqual(factory.refused, 1)
        self.assertIn(
            "HA port refused a connection from 10.0.0.3: the port holds its maximum of 2",
            formatEvent(events[0]),
        )
        self.lose(first)
        self.assertEqual(factory.connections, 1)
        self.assertIsNotNone(self.connect(factory, "10.0.0.3"))

    def test_per_peer_limit(self) -> None:
        """
        One host cannot take more than C{max_per_peer} connections;
        another host still gets in.
        """
        factory = self.limited(max_per_peer=2)
        protocols = [self.connect(factory, port=p) for p in (1, 2)]
        self.assertIsNone(self.connect(factory, port=3))
        self.assertIsNotNone(self.connect(factory, "10.0.0.2"))
        self.lose(protocols[0])
        self.assertIsNotNone(self.connect(factory, port=4))

    def test_shared_budget(self) -> None:
        """
        Ports share one budget (the descriptors left after the reserve):
        when it is used up, every port refuses.
        """
        budget = ConnectionBudget(2)
        ha = self.limited(budget=budget)
        http = LimitedFactory(Factory.forProtocol(Protocol), self.clock, name="HTTP", budget=budget)
        self.connect(ha, port=1)
        last = self.connect(http, port=2)
        self.assertIsNone(self.connect(ha, "10.0.0.2"))
        self.assertIsNone(self.connect(http, "10.0.0.2"))
        self.lose(last)
        self.assertEqual(budget.open, 1)
        self.assertIsNotNone(self.connect(ha, "10.0.0.2"))

    def test_refused_inside_tls(self) -> None:
        """
        Wrapped by another wrapper (TLS builds a protocol around ours and
        cannot take none), a refused connection gets a protocol that
        aborts it before anything is read, so no handshake is done.
        """
        factory = self.limited(max_connections=1)
        accepted = factory.buildProtocol(address())
        assert accepted is not None
        wrapper = ProtocolWrapper(Factory(), Protocol())  # type: ignore[arg-type]
        wrapper.transport = StringTransport()
        accepted.makeConnection(wrapper)
        refused = factory.buildProtocol(address("10.0.0.2"))
        assert refused is not None
        transport = StringTransport()
        refused.makeConnection(transport)
        self.assertTrue(transport.disconnecting)

    def test_passes_on_alpn_protocols(self) -> None:
        """
        The limiter offers TLS the wrapped factory's ALPN protocols (a
        C{Site}'s C{http/1.1}, C{h2} first when HTTP/2 is installed), and
        none when the wrapped factory names none: without it, TLS sees no
        protocol to select for the admin port's clients that offer ALPN.
        """
        from twisted.internet.interfaces import IProtocolNegotiationFactory
        from twisted.web.resource import Resource
        from twisted.web.server import Site

        site = Site(Resource())
        limited = LimitedFactory(site, self.clock, name="HTTP")
        self.assertTrue(IProtocolNegotiationFactory.providedBy(limited))
        self.assertEqual(limited.acceptableProtocols(), site.acceptableProtocols())
        self.assertIn(b"http/1.1", limited.acceptableProtocols())
        self.assertEqual(self.limited().acceptableProtocols(), [])

    def test_refusals_logged_at_a_bounded_rate(self) -> None:
        """
        A flood of refused connections logs one line per interval, which
        counts the ones it did not log.
        """
        factory = self.limited(max_per_peer=1)
        self.connect(factory)
        with capturedLogs() as events:
            for _ in range(100):
                self.connect(factory)
            self.clock.advance(10)
            self.connect(factory)
        lines = [formatEvent(e) for e in events]
        self.assertEqual(len(lines), 2)
        self.assertIn("(99 more refused since the last such line)", lines[1])
        self.assertEqual(factory.refused, 101)

    def test_bad_limits(self) -> None:
        """
        A limit below 1 is an error naming both values.
        """
        e = self.assertRaises(ValueError, self.limited, max_connections=0)
        self.assertIn("0 per port", str(e))


class FdLimitTests(SynchronousTestCase):
    """
    At start the soft open-files limit is raised to the hard one.
    """

    def test_raised_to_hard(self) -> None:
        calls: list[tuple[int, tuple[int, int]]] = []
        soft = raise_fd_limit(
            lambda _: (1024, 4096), lambda which, limits: calls.append((which, limits))
        )
        self.assertEqual(soft, 4096)
        self.assertEqual(calls, [(resource.RLIMIT_NOFILE, (4096, 4096))])

    def test_refused_raise_keeps_soft(self) -> None:
        """
        A refused raise is logged and the old soft limit kept.
        """

        def refuse(which: int, limits: tuple[int, int]) -> None:
            raise ValueError("not allowed")

        with capturedLogs() as events:
            soft = raise_fd_limit(lambda _: (1024, 4096), refuse)
        self.assertEqual(soft, 1024)
        self.assertIn("not allowed", formatEvent(events[0]))

    def test_already_at_hard(self) -> None:
        def never(which: int, limits: tuple[int, int]) -> None:
            raise AssertionError("nothing to raise")

        self.assertEqual(raise_fd_limit(lambda _: (4096, 4096), never), 4096)


class BrokerLimitTests(SynchronousTestCase):
    """
    A broker wraps its HA port and its admin HTTP port in the limiter,
    with one budget sized from the open-files limit.
    """

    def test_both_ports_limited(self) -> None:
        """
        Both listening factories are limiters sharing one budget: the soft
        limit less the reserve; a configured cap that does not fit is
        logged.
        """
        reactor = MemoryReactorClock()
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(
                role=Role.SYNC_MASTER,
                ha_listen="tcp:0:interface=127.0.0.1",
                max_connections=300,
                max_connections_per_peer=3,
            ),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            fd_limit=lambda: 512,
        )
        AdminService(broker, "tcp:0:interface=127.0.0.1").setServiceParent(broker)
        with capturedLogs() as events:
            broker.startService()
        self.addCleanup(broker.stopService)
        factories = [server[1] for server in reactor.tcpServers]
        self.assertEqual(len(factories), 2)
        self.assertTrue(all(isinstance(f, LimitedFactory) for f in factories))
        # (The HA port listens before the store opens: the master factory
        # is set in its placeholder then.)
        self.assertIs(factories[0].wrappedFactory.factory, broker.master_factory)
        self.assertEqual({f.name for f in factories}, {"HA", "HTTP"})
        budget = broker.ports.budget
        assert budget is not None
        self.assertEqual(budget.total, 512 - FD_RESERVE)
        self.assertTrue(all(f.budget is budget and f.max_per_peer == 3 for f in factories))
        self.assertTrue(any("at most 448 connections in all" in formatEvent(e) for e in events))

    def test_stopped_after_its_address_was_asked(self) -> None:
        """
        Asking a master for its HA address (L{Broker.ha_address}) leaves
        the listening port where the service stops it: a later
        C{stopService} stops listening and succeeds (it called
        C{stopListening} on the address, and failed, leaving the port
        open).
        """
        reactor = MemoryReactorClock()
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1"),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
        )
        broker.startService()
        service = broker.ha_service
        assert isinstance(service, StreamServerEndpointService)
        waiting = service._waitingForPort
        assert waiting is not None

        def held() -> Any:
            # (What the service's Deferred holds, left there:
            # successResultOf would take it out.)
            now: list[Any] = []
            waiting.addCallback(lambda result: now.append(result) or result)
            return now[0]

        port = held()
        self.assertEqual(self.successResultOf(broker.ha_address()), port.getHost())
        self.assertIs(held(), port)
        stopped: list[object] = []
        port.stopListening = lambda: stopped.append(port)
        self.addCleanup(broker.stopService)
        self.successResultOf(service.stopService())
        self.assertEqual(stopped, [port])
