"""
Tests for L{rmqha.admin.view}: the one read-only snapshot of a broker
(L{BrokerStatus}) that C{/status} and C{/metrics} read, built from what
each part reports of itself -- a master with a slave, the slave, a halted
replica, a node standing by, and failover nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rmqha.admin import status
from rmqha.admin.metrics import BrokerCollector
from rmqha.admin.view import BrokerStatus, broker_status
from rmqha.broker import Broker, Role
from rmqha.ha.group import PutStatus
from rmqha.ha.masterside import MasterSideStatus
from rmqha.ha.replica import ReplicaState, ReplicaStatus
from rmqha.store.service import StoreStatus

from tests.test_coordinator import _Group
from tests.test_roles import SEGMENT


def _samples(broker: Broker, failover: Any = None) -> dict[str, float]:
    """
    The collector's unlabelled samples (and C{name{label}} for labelled
    ones), by sample name.
    """
    found: dict[str, float] = {}
    for metric in BrokerCollector(broker, None, failover).collect():
        for sample in metric.samples:
            labels = ",".join(f"{v}" for _, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


class BrokerStatusTests(_Group):
    """
    L{broker_status} on brokers connected in memory.
    """

    def master_and_slave(self) -> tuple[Broker, Broker]:
        master = self.broker(Role.SYNC_MASTER)
        slave = self.broker(Role.SLAVE, master)
        self.addCleanup(self.stop, slave, master)
        self.settle()
        put = self.put(master)
        self.settle()
        self.assertIs(self.successResultOf(put).status, PutStatus.PUT_OK)
        return master, slave

    def test_master_with_a_slave(self) -> None:
        """
        A master's view: its role, the store's offsets, its one slave
        (acknowledged up to the end, over checked framing), the put counted
        as C{PUT_OK}; no slave half, no failover.
        """
        master, _ = self.master_and_slave()
        view = broker_status(master)
        end = master.commitlog.max_offset
        self.assertIs(view.role, Role.SYNC_MASTER)
        self.assertEqual(
            dataclasses.replace(view.store, prefault=None),
            StoreStatus(0, end, master.commitlog.flushed_offset),
        )
        # (The pre-faulting's figures: the log's own, where it has one.)
        figures = master.commitlog.prefault_figures()
        if figures is None:
            self.assertIsNone(view.store.prefault)
        else:
            assert view.store.prefault is not None
            self.assertEqual(view.store.prefault[:2], figures[:2])
        assert view.master is not None
        (slave,) = view.master.slaves
        self.assertEqual((slave.ack_offset, slave.lag_bytes), (end, 0))
        self.assertEqual(slave.framing, "checked")
        self.assertEqual(view.master.checksum_failures, 0)
        self.assertEqual((view.puts.puts, view.puts.statuses[PutStatus.PUT_OK]), (1, 1))
        self.assertEqual(view.puts.put_bytes, end)
        self.assertEqual(
            (view.replica, view.master_endpoint, view.failover, view.problem),
            (None, None, None, None),
        )
        self.assertEqual(status(master), view.as_json())
        self.assertEqual([s["ack_offset"] for s in view.as_json()["slaves"]], [end])

    def test_slave(self) -> None:
        """
        A slave's view: replicating, connected and caught up (a heartbeat
        said so) over checked framing from an rmqha master, nothing failed,
        no master half.
        """
        master, slave = self.master_and_slave()
        self.elapse(6)
        view = broker_status(slave)
        self.assertIs(view.role, Role.SLAVE)
        self.assertIsNone(view.master)
        replica = view.replica
        assert replica is not None
        self.assertIs(replica.state, ReplicaState.REPLICATING)
        self.assertEqual(
            (replica.connected, replica.caught_up, replica.checked, replica.master_kind),
            (True, True, True, "rmqha"),
        )
        self.assertEqual((replica.failed_checks, replica.divergence, replica.problem), (0, None, None))
        self.assertEqual(replica.connections_made, 1)
        self.assertGreater(replica.bytes_received, 0)
        self.assertEqual(view.store.max_offset, master.commitlog.max_offset)
        self.assertIsNotNone(view.master_endpoint)
        answer = view.as_json()
        self.assertEqual(
            (answer["connected"], answer["lag_bytes"], answer["framing"]), (True, 0, "checked")
        )
        self.assertEqual(_samples(slave)["rmqha_master_connected"], 1)
        self.assertEqual(
            _samples(slave)["rmqha_replicated_bytes_total"], replica.bytes_received
        )

    def test_snapshot_is_read_only_and_fixed(self) -> None:
        """
        A view does not change when the broker does, and cannot be changed.
        """
        master, _ = self.master_and_slave()
        view = broker_status(master)
        end = view.store.max_offset
        self.put(master)
        self.settle()
        self.assertEqual((view.store.max_offset, view.puts.puts), (end, 1))
        self.assertGreater(broker_status(master).store.max_offset, end)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            view.role = Role.SLAVE  # type: ignore[misc]
        with self.assertRaises(TypeError):
            view.puts.statuses[PutStatus.PUT_OK] = 0  # type: ignore[index]

    def test_halted_replica(self) -> None:
        """
        A slave whose master's segments differ in size halts: the view
        says so, not connected, with the problem naming the setting, and
        the broker-level problem is the replica's.
        """
        master = self.broker(Role.ASYNC_MASTER)
        slave = self.broker(Role.SLAVE, master, segment=2 * SEGMENT)
        self.addCleanup(self.stop, slave, master)
        self.settle()
        self.assertTrue(slave.halted)
        view = broker_status(slave)
        replica = view.replica
        assert replica is not None
        self.assertIs(replica.state, ReplicaState.HALTED)
        self.assertFalse(replica.connected)
        self.assertIn("mappedFileSizeCommitLog", replica.problem or "")
        self.assertEqual(view.problem, replica.problem)
        self.assertEqual(view.as_json()["problem"], replica.problem)
        self.assertIsNone(view.as_json()["lag_bytes"])

    def test_standing_by(self) -> None:
        """
        A coordinated node with no role yet runs no replica: its view is a
        slave's with nothing counted, and no master endpoint.
        """
        broker = self.coordinated_broker("x")
        self.addCleanup(self.stop, broker)
        self.assertIsNone(broker.role_service)
        view = broker_status(broker)
        self.assertIs(view.role, Role.SLAVE)
        self.assertEqual(view.replica, ReplicaStatus())
        self.assertIsNone(view.master_endpoint)
        self.assertEqual(
            _samples(broker)["rmqha_divergences_total{different}"], 0
        )

    def test_failover_nodes(self) -> None:
        """
        Failover: each node's view carries its coordinator's status (the
        elected master, epoch, in-sync set) and how ids are proven; the
        master's side shows the other node, the other node's replica
        follows it, and the failover metrics come from the same view.
        """
        for name in "ab":
            self.node(name, advertise_http=f"{name}:8080")
        self.elapse(2)
        a, b = self.nodes["a"], self.nodes["b"]
        views: dict[str, BrokerStatus] = {
            n: broker_status(self.nodes[n].broker, self.nodes[n].coordinator) for n in "ab"
        }
        for view in views.values():
            assert view.failover is not None
            self.assertEqual(view.failover.coordinator["master"]["node_id"], "a")
            self.assertEqual(view.failover.coordinator["in_sync"], ["a", "b"])
            self.assertEqual(view.failover.auth, "none (--insecure-group)")
            self.assertEqual(view.as_json()["failover"]["auth"], "none (--insecure-group)")
        master = views["a"].master
        assert isinstance(master, MasterSideStatus)
        self.assertEqual([s.replica_id for s in master.slaves], ["b"])
        replica = views["b"].replica
        assert replica is not None
        self.assertIs(replica.state, ReplicaState.REPLICATING)
        self.assertEqual((replica.epoch_truncations, replica.epoch_truncated_bytes), (0, 0))
        self.assertEqual(_samples(a.broker, a.coordinator)["rmqha_failover_is_master"], 1)
        self.assertEqual(_samples(b.broker, b.coordinator)["rmqha_failover_is_master"], 0)
        self.assertEqual(_samples(b.broker, b.coordinator)["rmqha_failover_epoch"], 1)
