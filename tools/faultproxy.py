# -*- test-case-name: tests.test_faultproxy,tests.integration.test_network_faults -*-
"""
A fault-injecting TCP proxy (Twisted), for putting between a master and a
slave in tests and experiments.

    proxy = FaultProxy(reactor, TCP4ClientEndpoint(reactor, "127.0.0.1", master_port))
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(proxy)
    proxy.faults.delay = 0.005          # seconds added to every chunk
    proxy.stall()                       # hold every byte (both ways) ...
    proxy.resume()                      # ... and let it go
    proxy.reset_after(5000)             # abort both sides after 5,000 more bytes
    proxy.half_open()                   # swallow everything, close nothing
    proxy.flip_bits(100_000, 500)       # flip a random bit about every 100 kB
                                        # to the slave, every 500 B to the master

Faults apply to every connection through the proxy, present and future.
A developer tool (C{tools/}, not shipped): the network-fault tests and
experiments from a checkout use it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure

__all__ = ["FaultProxy", "Faults"]


@dataclass
class Faults:
    """
    What the proxy does to the bytes it forwards.
    """

    #: Seconds by which every chunk is held before it is forwarded.
    delay: float = 0.0
    #: Hold everything (both directions) until resumed.
    stalled: bool = False
    #: Abort both sides once this many more master-to-slave bytes passed.
    reset_in: int | None = None
    #: Drop every byte, both ways, and keep the connections open.
    half_open: bool = False
    #: Flip one random bit about every this many master-to-slave bytes.
    flip_to_slave: int | None = None
    #: Flip one random bit about every this many slave-to-master bytes.
    flip_to_master: int | None = None
    #: Where the flipped bits are chosen (seed it to repeat a run).
    rng: random.Random = field(default_factory=random.Random)


class _Side(Protocol):
    """
    One end of a proxied connection; C{peer} is the other end.
    """

    def __init__(self, proxy: "FaultProxy", downstream: bool) -> None:
        self.proxy = proxy
        # True for the slave-facing side: its bytes go to the master.
        self.downstream = downstream
        self.peer: _Side | None = None
        self.held: deque[bytes] = deque()
        self.closed = False
        # Bytes (in this direction) until the next flipped bit.
        self._flip_in: int | None = None

    def dataReceived(self, data: bytes) -> None:
        faults = self.proxy.faults
        if faults.half_open:
            return
        every = faults.flip_to_master if self.downstream else faults.flip_to_slave
        if every is not None:
            data = self._flip(data, every, faults.rng)
        if not self.downstream and faults.reset_in is not None:
            # Master-to-slave bytes: cut mid-stream, likely mid-frame.
            if len(data) >= faults.reset_in:
                data = data[: faults.reset_in]
                faults.reset_in = None
                self._forward(data)
                self.proxy.resets += 1
                self.proxy.clock.callLater(faults.delay, self._abort_both)
                return
            faults.reset_in -= len(data)
        self._forward(data)

    def _flip(self, data: bytes, every: int, rng: random.Random) -> bytes:
        damaged: bytearray | None = None
        position = 0
        while True:
            if self._flip_in is None:
                self._flip_in = rng.randint(1, 2 * every)
            if position + self._flip_in > len(data):
                self._flip_in -= len(data) - position
                break
            position += self._flip_in
            self._flip_in = None
            if damaged is None:
                damaged = bytearray(data)
            damaged[position - 1] ^= 1 << rng.randrange(8)
            self.proxy.flips += 1
        return data if damaged is None else bytes(damaged)

    def _forward(self, data: bytes) -> None:
        faults = self.proxy.faults
        if faults.stalled or self.peer is None:
            # (No peer yet: the connection to the master is being made.)
            self.held.append(data)
        elif faults.delay:
            self.proxy.clock.callLater(faults.delay, self._deliver, data)
        else:
            self._deliver(data)

    def _deliver(self, data: bytes) -> None:
        if self.peer is not None and not self.peer.closed and self.peer.transport:
            self.peer.transport.write(data)

    def release(self) -> None:
        while self.held and self.peer is not None:
            self._deliver(self.held.popleft())

    def _abort_both(self) -> None:
        for side in (self, self.peer):
            if side is not None and side.transport is not None and not side.closed:
                side.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True
        self.proxy.sides.discard(self)
        peer = self.peer
        if peer is not None and not peer.closed and peer.transport is not None:
            if not self.proxy.faults.half_open:
                peer.transport.loseConnection()


class FaultProxy(Factory):
    """
    Accepts a slave's connection and opens one to the master for it.
    """

    def __init__(self, clock: Any, master: IStreamClientEndpoint) -> None:
        self.clock = clock
        self.master = master
        self.faults = Faults()
        self.sides: set[_Side] = set()
        #: Connections accepted, resets injected, bits flipped.
        self.connections = 0
        self.resets = 0
        self.flips = 0

    def buildProtocol(self, addr: Any) -> _Side:
        self.connections += 1
        slave_side = _Side(self, downstream=True)
        self.sides.add(slave_side)

        class _Upstream(Factory):
            def buildProtocol(inner, addr: Any) -> _Side:  # noqa: N805
                master_side = _Side(self, downstream=False)
                master_side.peer = slave_side
                slave_side.peer = master_side
                self.sides.add(master_side)
                return master_side

        def failed(reason: Failure) -> None:
            if slave_side.transport is not None:
                slave_side.transport.loseConnection()

        def connected(master_side: _Side) -> None:
            # Bytes the slave sent before the master side was up.
            slave_side.release()

        d = self.master.connect(_Upstream())
        d.addCallbacks(connected, failed)
        return slave_side

    def stall(self) -> None:
        self.faults.stalled = True

    def resume(self) -> None:
        self.faults.stalled = False
        for side in list(self.sides):
            side.release()

    def reset_after(self, nbytes: int) -> None:
        self.faults.reset_in = nbytes

    def half_open(self, on: bool = True) -> None:
        self.faults.half_open = on

    def flip_bits(
        self, to_slave: int | None, to_master: int | None = None, seed: int | None = None
    ) -> None:
        """
        Flip one random bit about every C{to_slave} bytes the master sends
        and every C{to_master} bytes the slave sends (C{None}: none).
        """
        self.faults.flip_to_slave = to_slave
        self.faults.flip_to_master = to_master
        if seed is not None:
            self.faults.rng.seed(seed)

    def clear(self) -> None:
        """
        No more faults (a stall is released).
        """
        self.faults.delay = 0.0
        self.faults.reset_in = None
        self.faults.half_open = False
        self.faults.flip_to_slave = self.faults.flip_to_master = None
        self.resume()
