"""
Tests for L{tools.faultproxy}'s bit flips, in memory.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from tools.faultproxy import FaultProxy, _Side


def _pair(proxy: FaultProxy) -> tuple[_Side, _Side, StringTransport, StringTransport]:
    """
    The master-facing and the slave-facing sides of one proxied connection,
    and what each delivers (to the slave, to the master).
    """
    master_side, slave_side = _Side(proxy, downstream=False), _Side(proxy, downstream=True)
    master_side.peer, slave_side.peer = slave_side, master_side
    to_slave, to_master = StringTransport(), StringTransport()
    slave_side.makeConnection(to_slave)
    master_side.makeConnection(to_master)
    return master_side, slave_side, to_slave, to_master


def _bits(data: bytes) -> int:
    return sum(bin(b).count("1") for b in data)


class FlipTests(SynchronousTestCase):
    def run_once(self, seed: int) -> tuple[bytes, bytes, int]:
        proxy = FaultProxy(Clock(), master=None)  # type: ignore[arg-type]
        proxy.flip_bits(1000, None, seed=seed)
        master_side, slave_side, to_slave, to_master = _pair(proxy)
        for _ in range(100):
            master_side.dataReceived(bytes(1000))
            slave_side.dataReceived(bytes(1000))
        return to_slave.value(), to_master.value(), proxy.flips

    def test_rate_direction_and_seed(self) -> None:
        """
        About one bit per C{every} bytes is flipped in the chosen direction
        only, each flip counted; the same seed flips the same bits.
        """
        to_slave, to_master, flips = self.run_once(seed=3)
        self.assertEqual(len(to_slave), 100_000)
        self.assertEqual(_bits(to_slave), flips)
        self.assertTrue(50 <= flips <= 200, flips)
        self.assertEqual(to_master, bytes(100_000))
        self.assertEqual(self.run_once(seed=3), (to_slave, to_master, flips))
        self.assertNotEqual(self.run_once(seed=4)[0], to_slave)
