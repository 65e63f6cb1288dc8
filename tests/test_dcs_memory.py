"""
The in-memory DCS (L{rmqha.coord.memory}) keeps the L{IDCS} contract
(tests/_dcs_contract.py), the same tests etcd passes in
tests/integration/test_etcd_dcs.py: on a L{Clock}, leases expiring when it
is advanced.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.coord.dcs import Lease
from rmqha.coord.memory import MemoryDCS, MemoryStore

from tests._dcs_contract import DCSContractMixin, Scenario


class MemoryContractTests(DCSContractMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.store = MemoryStore(self.clock)

    def make_dcs(self) -> MemoryDCS:
        return MemoryDCS(self.store, "g")

    def expire(self, lease: Lease) -> None:
        self.clock.advance(lease.ttl)

    def run_scenario(self, scenario: Scenario) -> None:
        self.successResultOf(Deferred.fromCoroutine(scenario()))

    async def pause(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def put_raw(self, dcs: MemoryDCS, name: str, value: bytes) -> None:
        key = dcs.prefix + name
        self.store.begin()
        self.store.put(key, value)
        self.store.commit([key])
