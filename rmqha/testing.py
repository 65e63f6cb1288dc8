# -*- test-case-name: tests.test_testing -*-
"""
Public fakes for testing code that embeds rmqha, and for rmqha's own tests
(treq's C{treq.testing} is the model).

In memory, on a L{Clock}, no sockets:

    - L{connect_in_memory}: a master-side and a slave-side factory joined
      by one in-memory connection (C{twisted.test.iosim}), plain or TLS
      (rmqha's L{TLSFactory} on either side, on the same clock), with an
      optional fault on the wire; the L{MemoryConnection} it returns moves
      the bytes (L{MemoryConnection.flush}) and hangs up.
    - L{StringEndpoint}: a client endpoint whose connections are
      L{StringTransport}s, or that refuses them.
    - L{FakeNameServer}: a RocketMQ NameServer in memory (registration,
      routes, cluster info; a broker forgotten when its connection closes
      or after 120 s without a registration) for tests and the demo, reached in memory
      (L{FakeNameServer.client_endpoint}) or on a real port
      (L{FakeNameServer.listen}, port 0).  Not for production: users run
      RocketMQ's own NameServer.

Only fakes: no process or thread, and no socket unless asked for
(L{FakeNameServer.listen}).  rmqha's own
real-process harnesses (a fault-injecting TCP proxy, etcd members, a
failover group of C{twistd} nodes) are developer tools in a checkout's
C{tools/} (docs/development.md), not part of the package.

Example, a slave replicating a master's log in memory::

    clock = Clock()
    connection = connect_in_memory(
        MasterFactory(source, clock), SlaveFactory(replica, clock), clock
    )
    connection.slave.send_report()
    connection.flush()
    assert replica.max_offset == source.max_offset
    connection.hang_up()
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import (
    IAddress,
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
)
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.test import iosim
from zope.interface import implementer

from rmqha._tlsbio import TLSFactory

__all__ = [
    "FakeNameServer",
    "Fault",
    "MASTER_ADDRESS",
    "MemoryConnection",
    "MemoryNameServerEndpoint",
    "RegistrationRecord",
    "SLAVE_ADDRESS",
    "StringEndpoint",
    "connect_in_memory",
]

#: Where the master listens and where the slave connects from, as each
#: side of an in-memory connection sees the other.
MASTER_ADDRESS = IPv4Address("TCP", "127.0.0.1", 10912)
SLAVE_ADDRESS = IPv4Address("TCP", "127.0.0.1", 50000)

#: C{fault(data, to_slave)}: what arrives of C{data} (bytes one side wrote,
#: C{to_slave} when the master wrote them).
Fault = Callable[[bytes, bool], bytes]


class MemoryConnection:
    """
    One in-memory connection between a master-side and a slave-side
    protocol, made by L{connect_in_memory}.

    @ivar master: the protocol the master-side factory built (under TLS,
        the one inside the TLS layer).
    @ivar slave: likewise on the slave side.
    @ivar server: the outermost master-side protocol (the TLS layer under
        TLS, else C{master}).
    @ivar client: likewise on the slave side.
    @ivar server_transport: the master side's L{iosim.FakeTransport}.
    @ivar client_transport: the slave side's transport.
    @ivar clock: the clock both sides (and TLS) run on.
    """

    def __init__(
        self,
        server: Any,
        client: Any,
        server_transport: iosim.FakeTransport,
        client_transport: iosim.FakeTransport,
        clock: Clock,
        fault: Fault | None,
        read_size: int | None,
    ) -> None:
        self.server, self.client = server, client
        self.master = _inner(server)
        self.slave = _inner(client)
        self.server_transport = server_transport
        self.client_transport = client_transport
        self.clock = clock
        self._fault = fault
        self._read_size = read_size
        self._pump = iosim.IOPump(
            client, server, client_transport, server_transport, False, clock=clock
        )

    @property
    def dropped(self) -> bool:
        """
        Whether either side has closed or aborted the connection.
        """
        return bool(self.server_transport.disconnecting or self.client_transport.disconnecting)

    def flush(self, limit: int = 100_000) -> None:
        """
        Until nothing moves: run the calls due on the clock (C{advance(0)}:
        TLS and the protocols write on the next turn), then deliver
        everything written, both ways, and a hang-up to the other side.

        With a fault (see L{connect_in_memory}), bytes go through it in
        reads of at most C{read_size}, and delivery stops as soon as either
        side drops the connection: what was in flight is lost, as on a
        reset; L{hang_up} then tells both sides.

        @param limit: how many rounds before giving up with
            C{AssertionError} (a conversation that never goes quiet).
        """
        for _ in range(limit):
            if self._fault is None and self._read_size is None:
                moved = self._pump.pump()
            else:
                moved = self._pump_faulty()
            if not moved:
                return
        raise AssertionError(f"the in-memory connection was still busy after {limit} rounds")

    def _pump_faulty(self) -> bool:
        if self.dropped:
            return False
        self.clock.advance(0)
        to_master = self.client_transport.getOutBuffer()
        to_slave = self.server_transport.getOutBuffer()
        # As iosim's pump: a pull producer gets its turn.
        self.client_transport._checkProducer()
        self.server_transport._checkProducer()
        fault = self._fault or (lambda data, to_slave: data)
        for data, to_slave_side in ((to_master, False), (to_slave, True)):
            if not data:
                continue
            receiver = self.client_transport if to_slave_side else self.server_transport
            piece = self._read_size or len(data)
            for i in range(0, len(data), piece):
                if self.dropped:
                    return False
                receiver.bufferReceived(fault(data[i : i + piece], to_slave_side))
        return bool(to_master or to_slave)

    def hang_up(self) -> None:
        """
        Close the connection from the slave's side and let both sides
        see it (then run the calls due on the clock).  Safe to call twice.
        """
        if self._fault is None and self._read_size is None:
            self.client_transport.loseConnection()
            self._pump.flush()
        else:
            for transport in (self.server_transport, self.client_transport):
                if not transport.disconnected:
                    transport.disconnected = True
                    transport.reportDisconnect()
        self.clock.advance(0)


def _inner(protocol: Any) -> Any:
    if isinstance(protocol, TLSMemoryBIOProtocol):
        return protocol.wrappedProtocol
    return protocol


def connect_in_memory(
    master: IProtocolFactory,
    slave: IProtocolFactory,
    clock: Clock,
    *,
    master_tls: Any = None,
    slave_tls: Any = None,
    fault: Fault | None = None,
    read_size: int | None = None,
    slave_transport: Callable[[IProtocol], iosim.FakeTransport] | None = None,
    master_address: IAddress = MASTER_ADDRESS,
    slave_address: IAddress = SLAVE_ADDRESS,
) -> MemoryConnection:
    """
    Connect a protocol from C{master} (the accepting side) to one from
    C{slave} (the dialling side) in memory; nothing moves until
    L{MemoryConnection.flush}.

    @param master: builds the master side, given C{slave_address}.
    @param slave: builds the slave side (a C{SlaveFactory}, or any client
        factory, e.g. C{Factory.forProtocol(ControlClient)}), given
        C{master_address}.
    @param clock: what both sides and TLS schedule on.
    @param master_tls: a server TLS connection creator (e.g.
        L{rmqha.tls.server_context}'s); the master side then speaks TLS.
    @param slave_tls: a client TLS connection creator (e.g.
        C{optionsForClientTLS(...)}); the slave side then speaks TLS.
        Either side may speak TLS without the other (a misconfiguration).
    @param fault: C{fault(data, to_slave)} returns what arrives of
        C{data}; see L{MemoryConnection.flush}.
    @param read_size: deliver in reads of at most this many bytes (with a
        fault: what one read of the faulty link carries).
    @param slave_transport: makes the slave side's transport from its
        outermost protocol (default: an L{iosim.FakeTransport} with the
        two addresses).
    """
    if master_tls is not None:
        master = TLSFactory(master_tls, False, master, clock=clock)
    if slave_tls is not None:
        slave = TLSFactory(slave_tls, True, slave, clock=clock)
    server = master.buildProtocol(slave_address)
    client = slave.buildProtocol(master_address)
    if server is None or client is None:
        raise ValueError("a factory refused to build a protocol")
    server_transport = iosim.FakeTransport(
        server, isServer=True, hostAddress=master_address, peerAddress=slave_address
    )
    if slave_transport is None:
        client_transport = iosim.FakeTransport(
            client, isServer=False, hostAddress=slave_address, peerAddress=master_address
        )
    else:
        client_transport = slave_transport(client)
    server.makeConnection(server_transport)
    client.makeConnection(client_transport)
    return MemoryConnection(
        server, client, server_transport, client_transport, clock, fault, read_size
    )


@implementer(IStreamClientEndpoint)
class StringEndpoint:
    """
    A client endpoint whose connections are C{StringTransport}s (kept in
    C{connected} with their protocols, newest last), or that refuses them
    while C{refuse} is set.  A C{ClientService} given one dials it as it
    would a real master.
    """

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.connected: list[tuple[Any, StringTransport]] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        if self.refuse:
            return fail(ConnectionRefusedError())
        protocol = factory.buildProtocol(MASTER_ADDRESS)
        transport = StringTransport()
        assert protocol is not None
        protocol.makeConnection(transport)
        self.connected.append((protocol, transport))
        return succeed(protocol)


# (At the end: the fake builds its in-memory connections with the above.)
from rmqha._fakenamesrv import (  # noqa: E402
    FakeNameServer,
    MemoryNameServerEndpoint,
    RegistrationRecord,
)
