"""
Tests for automatic failover's election and fencing (L{rmqha.coord.node}):
real brokers in memory on one clock, coordinated through the in-memory DCS
(L{rmqha.coord.memory}), connected over iosim.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail, succeed

from rmqha.broker import Broker, NotMasterError, Role
from rmqha.settings import BrokerSettings
from rmqha.coord.dcs import DCSError, InSync, Switchover
from rmqha.coord.memory import MemoryDCS, MemoryStore
from rmqha.coord.failover import FailoverSettings
from rmqha.coord.node import Coordinator, rank
from rmqha.ha.auth import GroupAuth
from rmqha.ha.epochs import EpochFile
from rmqha.ha.group import PutStatus
from rmqha.ha.masterside import MasterSide
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.testing import StringEndpoint

from tests._helpers import fixed_clock, settings_and_runtime
from tests.test_roles import SEGMENT, _InMemory


class _Node:
    def __init__(self, broker: Broker, dcs: MemoryDCS, coordinator: Coordinator) -> None:
        self.broker = broker
        self.dcs = dcs
        self.coordinator = coordinator

    @property
    def id(self) -> str:
        return self.coordinator.settings.node_id


class _Group(_InMemory):
    """
    A group of coordinated brokers.
    """

    def setUp(self) -> None:
        super().setUp()
        self.store = MemoryStore(self.clock)
        self.nodes: dict[str, _Node] = {}
        self.lost_wins: list[tuple[str, Any]] = []
        self.addCleanup(self._stop_all)

    #: Whether the nodes' stores keep consume queues.
    consume_queues = False

    def node(
        self,
        node_id: str,
        role: Role = Role.SYNC_MASTER,
        *,
        lose_campaign_answer: bool = False,
        **settings: Any,
    ) -> _Node:
        """
        Start node C{node_id}; with C{lose_campaign_answer}, its first
        campaign succeeds in the DCS but fails at the node, as a request
        that timed out under load does (the wins are in C{self.lost_wins}).
        """
        broker = self.coordinated_broker(
            node_id, settings.pop("min_in_sync_replicas", 2), settings.pop("segment", SEGMENT)
        )
        dcs = MemoryDCS(self.store, "g")
        if lose_campaign_answer:
            self._lose_campaign_answer(dcs, node_id)
        coordinator = Coordinator(
            self.clock,
            dcs,
            broker,
            FailoverSettings("g", node_id, f"{node_id}:10912", role=role, **settings),
            self.dial,
            now=self.clock.seconds,
            wall=self.clock.seconds,
        )
        coordinator.startService()
        node = self.nodes[node_id] = _Node(broker, dcs, coordinator)
        return node

    def coordinated_broker(
        self, node_id: str, min_in_sync_replicas: int = 2, segment: int | None = SEGMENT
    ) -> Broker:
        """
        A started broker as a coordinator finds it: standing by, with an
        epoch file, declaring C{node_id}; its store's segment size is
        C{segment} (C{None}: not configured).
        """
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(
                ha_listen="tcp:0",
                scrub_rate=0,
                node_id=node_id,
                min_in_sync_replicas=min_in_sync_replicas,
            ),
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(
                store, segment_size=segment, clock=fixed_clock, consume_queues=self.consume_queues
            ),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 0.1,
            fd_limit=lambda: 4096,
            coordinated=True,
            epochs=EpochFile(store),
            group_auth=self.group_auth(node_id),
        )
        broker.startService()
        return broker

    def group_auth(self, node_id: str) -> GroupAuth | None:
        """
        How node C{node_id} proves its id (none: an insecure group).
        """
        return None

    def _lose_campaign_answer(self, dcs: MemoryDCS, node_id: str) -> None:
        real = dcs.campaign

        def campaign(*args: Any) -> Deferred[Any]:
            dcs.campaign = real  # type: ignore[method-assign]
            self.lost_wins.append((node_id, self.successResultOf(real(*args))))
            return fail(DCSError("etcd memory: request timed out"))

        dcs.campaign = campaign  # type: ignore[method-assign]

    def uncoordinated_slave(self, master: _Node, **options: Any) -> Broker:
        """
        A slave of C{master} outside the group (no coordinator), stopped at
        the end of the test.
        """
        store = self.mktemp()
        settings, runtime = settings_and_runtime(
            options, role=Role.SLAVE, master_endpoint=self.endpoint(master.broker), scrub_rate=0
        )
        broker = Broker(
            settings,
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 0.1,
            fd_limit=lambda: 4096,
            **runtime,
        )
        broker.startService()
        self.addCleanup(self.stop, broker)
        return broker

    def dial(self, address: str, node_id: str | None = None) -> Any:
        node = self.nodes.get(address.split(":")[0])
        if node is None:  # (crashed: nothing listens there)
            return StringEndpoint(refuse=True)
        return self.endpoint(node.broker)

    def elapse(self, seconds: float, step: float = 0.1) -> None:
        """
        Let C{seconds} pass, pumping connections as they go.
        """
        elapsed = 0.0
        while elapsed < seconds - 1e-9:
            self.settle()
            self.clock.advance(step)
            elapsed += step
        self.settle()

    def master(self) -> _Node | None:
        masters = [n for n in self.nodes.values() if n.coordinator.leader is not None]
        self.assertLessEqual(len(masters), 1, "two masters")
        return masters[0] if masters else None

    def crash(self, node: _Node) -> None:
        """
        Kill a node: its coordinator and broker stop without telling the
        DCS anything (its lease expires by itself).
        """
        coordinator = node.coordinator
        if coordinator._loop is not None and coordinator._loop.running:
            coordinator._loop.stop()
        if coordinator._watch is not None:
            coordinator._watch.stop()
        coordinator._cancel_fence()
        coordinator.running = False
        coordinator.leader = None
        coordinator.lease = None
        self.nodes.pop(node.id)
        d = node.broker.stopService()
        self.settle()
        self.successResultOf(d)

    def three_with_acked_puts(self) -> tuple[_Node, int]:
        """
        Nodes a, b, c elected and in sync, and three puts answered PUT_OK
        by the master: the master, and where the last put ends.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        acked = [self.put(master.broker) for _ in range(3)]
        self.elapse(0.5)
        ends = [self.successResultOf(d) for d in acked]
        self.assertEqual({r.status for r in ends}, {PutStatus.PUT_OK})
        return master, ends[-1].next_offset

    def put(self, broker: Broker, body: bytes = b"x" * 100) -> Deferred[Any]:
        return broker.put(Message("FailoverTopic", body))

    def _stop_all(self) -> None:
        # Links a test stalled heal first: a stop waits for its connections
        # to close.
        for endpoint in self.endpoints:
            for pump in endpoint.pumps:
                pump.__dict__.pop("pump", None)
        for node in list(self.nodes.values()):
            node.coordinator.stopService()
            d = node.broker.stopService()
            self.settle()
            self.successResultOf(d)


class ElectionTests(_Group):
    def test_first_election(self) -> None:
        """
        Three nodes that start together elect one master (the lowest id
        among equal offsets), at epoch 1; the others follow it and enter
        the in-sync set, published in the DCS.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        self.assertEqual(master.id, "a")
        self.assertIsInstance(master.broker.role_service, MasterSide)
        self.assertEqual(master.coordinator.leader.epoch, 1)  # type: ignore[union-attr]
        d = self.put(master.broker)
        self.elapse(0.5)
        result = self.successResultOf(d)
        self.assertEqual(result.status, PutStatus.PUT_OK)
        view = self.successResultOf(master.dcs.load())
        self.assertEqual(view.in_sync, InSync(1, ("a", "b", "c")))
        for name in "bc":
            self.assertEqual(self.nodes[name].coordinator.following, "a:10912")
            self.assertEqual(
                self.nodes[name].broker.commitlog.max_offset, master.broker.commitlog.max_offset
            )

    def test_empty_node_adopts_the_masters_segment_size(self) -> None:
        """
        A node with an empty store and no segment size configured joins
        a group whose master has other segments: as a failover slave it
        takes the master's size (before its epochs are compared), copies
        the log and enters the in-sync set.
        """
        self.node("a")
        self.elapse(2)
        a = self.master()
        assert a is not None and a.id == "a"
        b = self.node("b", segment=None)
        self.elapse(2)
        self.assertEqual(b.broker.commitlog.segment_size, SEGMENT)
        d = self.put(a.broker)
        self.elapse(0.5)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        self.assertEqual(b.broker.commitlog.max_offset, a.broker.commitlog.max_offset)
        self.assertEqual(self.successResultOf(a.dcs.load()).in_sync, InSync(1, ("a", "b")))
        self.assertIsNone(b.broker.problem)

    def test_put_waits_for_every_in_sync_member(self) -> None:
        """
        A SYNC put is PUT_OK only once every in-sync member holds it: with
        one member's connection stalled, the put waits; when that member
        is dropped from the set (published first), the put is answered.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        # Stall c's link: its acks stop arriving.
        factory = master.broker.master_factory
        assert factory is not None
        link = next(c for c in factory.connections if c.failover_node == "c")
        stalled = next(p for e in self.endpoints for p in e.pumps if p.server is link)
        stalled.pump = lambda *a, **k: False  # type: ignore[method-assign]
        d = self.put(master.broker)
        self.elapse(1.0)
        self.assertNoResult(d)
        published = self.successResultOf(master.dcs.load()).in_sync
        self.assertEqual(published, InSync(1, ("a", "b", "c")))
        self.elapse(0.5)
        result = self.successResultOf(d)
        self.assertEqual(result.status, PutStatus.PUT_OK)
        published = self.successResultOf(master.dcs.load()).in_sync
        assert published is not None
        self.assertEqual(len(published.members), 2)

    def test_consumers_read_what_the_in_sync_set_holds(self) -> None:
        """
        A SYNC master's put reaches its consume queues (what pulls serve)
        only once every in-sync member holds it: a message read before
        could be lost with the master in a failover, and the new master
        write another at its place in the queue.  A slave's queues follow
        all it holds.
        """
        self.consume_queues = True
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        factory = master.broker.master_factory
        assert factory is not None
        link = next(c for c in factory.connections if c.failover_node == "c")
        stalled = next(p for e in self.endpoints for p in e.pumps if p.server is link)
        stalled.pump = lambda *a, **k: False  # type: ignore[method-assign]

        def units(node: _Node) -> int:
            queues = node.broker.commitlog.consume_queues
            assert queues is not None
            return queues.max_offset("FailoverTopic", 0)

        d = self.put(master.broker)
        self.elapse(1.0)
        self.assertNoResult(d)
        other = next(n for i, n in self.nodes.items() if n is not master and i != "c")
        self.assertEqual((units(master), units(other)), (0, 1))
        self.elapse(0.5)  # (c leaves the set: the put is PUT_OK)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        self.elapse(0.01)  # (dispatched 1 ms later)
        self.assertEqual(units(master), 1)

    def _cut(self, master: _Node, *nodes: str) -> None:
        """
        Cut the master's links to C{nodes} without a reset: nothing moves
        on them any more, and neither end sees them close.
        """
        factory = master.broker.master_factory
        assert factory is not None
        for link in [c for c in factory.connections if c.failover_node in nodes]:
            for pump in [p for e in self.endpoints for p in e.pumps if p.server is link]:
                pump.pump = lambda *a, **k: False  # type: ignore[method-assign]

    def _answers(self, broker: Broker, puts: int, step: float) -> dict[str, int]:
        """
        Put C{puts} messages C{step} seconds apart; count how each ended
        (refusals by status too), once every wait is over.
        """
        from rmqha.broker import NotStoredError

        waiting, counts = [], {}
        for _ in range(puts):
            try:
                waiting.append(self.put(broker))
            except NotStoredError as e:
                counts[e.status.value] = counts.get(e.status.value, 0) + 1
            self.elapse(step)
        self.elapse(4)
        for d in waiting:
            status = self.successResultOf(d).status.value
            counts[status] = counts.get(status, 0) + 1
        return counts

    def test_cut_from_every_slave_acks_nothing(self) -> None:
        """
        minInSyncReplicas is a floor for every PUT_OK: the master cut off
        from both slaves, which stay live members of the group, answers no
        put PUT_OK -- the first ones time out, and once the in-sync set is
        the master alone the rest are refused unstored -- and puts are
        PUT_OK again once the links heal.  (It used to answer PUT_OK alone
        once the set had shrunk to itself.)
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        self._cut(master, *(n for n in "abc" if n != master.id))
        counts = self._answers(master.broker, 30, 0.2)
        self.assertNotIn("PUT_OK", counts)
        self.assertGreater(counts.get("IN_SYNC_REPLICAS_NOT_ENOUGH", 0), 15, counts)
        self.assertGreater(counts.get("FLUSH_SLAVE_TIMEOUT", 0), 0, counts)
        self.assertIs(self.master(), master)
        published = self.successResultOf(master.dcs.load()).in_sync
        self.assertEqual(published, InSync(1, (master.id,)))

    def test_one_dead_one_cut_acks_nothing(self) -> None:
        """
        One slave crashed and the link to the other cut: no PUT_OK.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        slaves = [n for n in self.nodes.values() if n is not master]
        self.crash(slaves[0])
        self._cut(master, slaves[1].id)
        counts = self._answers(master.broker, 20, 0.2)
        self.assertNotIn("PUT_OK", counts)
        self.assertGreater(counts.get("IN_SYNC_REPLICAS_NOT_ENOUGH", 0), 10, counts)
        self.assertGreater(counts.get("FLUSH_SLAVE_TIMEOUT", 0), 0, counts)

    def test_failover_after_crash(self) -> None:
        """
        The master crashes: once its lease expires, an in-sync slave is
        elected at epoch 2 with every put the old master answered PUT_OK,
        and the other slave follows it.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        acked = []
        for _ in range(5):
            d = self.put(old.broker)
            self.settle()
            acked.append(self.successResultOf(d))
        self.assertEqual({r.status for r in acked}, {PutStatus.PUT_OK})
        end = acked[-1].next_offset
        self.crash(old)
        self.elapse(4)
        new = self.master()
        assert new is not None
        self.assertNotEqual(new.id, old.id)
        self.assertEqual(new.coordinator.leader.epoch, 2)  # type: ignore[union-attr]
        self.assertGreaterEqual(new.broker.commitlog.max_offset, end)
        d = self.put(new.broker)
        self.elapse(0.5)
        result = self.successResultOf(d)
        self.assertEqual(result.status, PutStatus.PUT_OK)
        other = next(n for n in self.nodes.values() if n is not new)
        self.assertEqual(other.coordinator.following, f"{new.id}:10912")

    def test_partitioned_master_stops_acknowledging_first(self) -> None:
        """
        A master cut off from the DCS (but not from its slaves) stops
        answering PUT_OK before its lease can expire; the new master's
        first PUT_OK comes after the old master's last.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        old.dcs.set_reachable(False)
        last_old_ok = None
        first_new_ok = None
        for _ in range(60):
            master = self.master()
            for node in list(self.nodes.values()):
                if not isinstance(node.broker.role_service, MasterSide):
                    continue
                try:
                    d = self.put(node.broker)
                except NotMasterError:
                    continue
                self.settle()
                if d.called:
                    result = self.successResultOf(d)
                    if result.status is PutStatus.PUT_OK:
                        if node is old:
                            last_old_ok = self.clock.seconds()
                        elif first_new_ok is None:
                            first_new_ok = self.clock.seconds()
            self.elapse(0.1)
            del master
        self.assertIsNotNone(last_old_ok)
        self.assertIsNotNone(first_new_ok)
        self.assertLess(last_old_ok, first_new_ok)  # type: ignore[operator]
        new = self.master()
        assert new is not None
        self.assertNotEqual(new.id, old.id)
        # Healing: the old master rejoins as a slave of the new one.
        old.dcs.set_reachable(True)
        self.elapse(3)
        self.assertIsNone(old.coordinator.leader)
        self.assertEqual(old.coordinator.following, f"{new.id}:10912")

    def test_out_of_sync_slave_not_elected(self) -> None:
        """
        A slave outside the in-sync set is never elected while an in-sync
        one lives, even with the higher offset.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        # Publish a set without c (as if c had fallen behind).
        view = self.successResultOf(master.dcs.load())
        leader = view.leader
        assert leader is not None
        master.coordinator.in_sync.wanted = frozenset({"a", "b"})  # type: ignore[union-attr]
        master.coordinator.in_sync.published = frozenset({"a", "b"})  # type: ignore[union-attr]
        self.successResultOf(master.dcs.publish_in_sync(InSync(1, ("a", "b")), leader))
        self.crash(master)
        self.elapse(4)
        new = self.master()
        assert new is not None
        self.assertEqual(new.id, "b")

    def test_no_quorum_no_election(self) -> None:
        """
        With the DCS without quorum, the master steps down within its
        lease and nobody is elected until the DCS is back.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        self.store.available = False
        self.elapse(2)
        self.assertIsNone(self.master())
        with self.assertRaises(NotMasterError):
            self.put(old.broker)
        self.store.available = True
        self.elapse(5)
        self.assertIsNotNone(self.master())

    def test_switchover(self) -> None:
        """
        A switchover to an in-sync slave: the master stops taking puts,
        the target catches up and is elected; every put answered before is
        on it.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        d = self.put(old.broker)
        self.elapse(0.2)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        asked = self.successResultOf(
            old.dcs.request_switchover(Switchover("c", old.id, self.clock.seconds()))
        )
        self.assertTrue(asked)
        self.elapse(2)
        new = self.master()
        assert new is not None
        self.assertEqual(new.id, "c")
        self.assertEqual(new.broker.commitlog.max_offset, old.broker.commitlog.max_offset)
        self.assertIsNone(self.successResultOf(new.dcs.load()).switchover)


class RankTests(_Group):
    def test_settings_refused(self) -> None:
        """
        Bad failover settings are one-line errors naming the setting.
        """
        with self.assertRaisesRegex(ValueError, "lease TTL 1"):
            FailoverSettings("g", "a", "a:1", lease_ttl=1)
        with self.assertRaisesRegex(ValueError, "role SLAVE"):
            FailoverSettings("g", "a", "a:1", role=Role.SLAVE)
        with self.assertRaisesRegex(ValueError, "group 'a/b'"):
            FailoverSettings("a/b", "a", "a:1")

    def test_rank(self) -> None:
        """
        Candidates: in-sync members by offset, the switchover target first;
        an unclean election only when allowed and no in-sync member lives.
        """
        from rmqha.coord.dcs import ClusterView, Member

        members = {
            "a": Member("a", "a:1", offset=10),
            "b": Member("b", "b:1", offset=30),
            "c": Member("c", "c:1", offset=20),
        }
        view = ClusterView(None, 3, 9, InSync(3, ("a", "c", "x")), members, None, 10)
        self.assertEqual([m.node_id for m in rank(view, False)[0]], ["c", "a"])
        gone = ClusterView(None, 3, 9, InSync(3, ("x",)), members, None, 10)
        self.assertEqual(rank(gone, False)[0], [])
        self.assertEqual([m.node_id for m in rank(gone, True)[0]], ["b", "c", "a"])
        switch = ClusterView(
            None, 3, 9, InSync(3, ("a", "c")), members, Switchover("a", "z"), 10
        )
        self.assertEqual([m.node_id for m in rank(switch, False)[0]], ["a", "c"])


class StatusTests(_Group):
    def test_status_and_hint(self) -> None:
        """
        /status on every node names the master, the epoch and the in-sync
        set; a slave's put refusal carries the master's address; the
        failover metrics are exported.
        """
        from rmqha.admin import master_hint, status
        from rmqha.admin.metrics import BrokerCollector

        for name in "ab":
            self.node(name, advertise_http=f"{name}:8080")
        self.elapse(2)
        a, b = self.nodes["a"], self.nodes["b"]
        for node in (a, b):
            failover = status(node.broker, node.coordinator)["failover"]
            self.assertEqual(failover["master"]["node_id"], "a")
            self.assertEqual(failover["epoch"], 1)
            self.assertEqual(failover["in_sync"], ["a", "b"])
            self.assertEqual(failover["in_sync_published"], ["a", "b"])
        self.assertTrue(status(a.broker, a.coordinator)["failover"]["is_master"])
        # While a change is on its way to etcd, the master's puts wait for
        # the set it wants; who may succeed it is the published one.
        assert a.coordinator.in_sync is not None
        a.coordinator.in_sync.wanted = frozenset({"a", "b", "c"})
        failover = status(a.broker, a.coordinator)["failover"]
        self.assertEqual(failover["in_sync"], ["a", "b", "c"])
        self.assertEqual(failover["in_sync_published"], ["a", "b"])
        self.assertEqual(
            master_hint(b.coordinator), {"node_id": "a", "http": "a:8080", "epoch": 1}
        )
        self.assertIsNone(master_hint(a.coordinator))
        metrics = {m.name: m for m in BrokerCollector(b.broker, None, b.coordinator).collect()}
        self.assertEqual(metrics["rmqha_failover_epoch"].samples[0].value, 1)
        self.assertEqual(metrics["rmqha_failover_is_master"].samples[0].value, 0)


class ClusterCommandTests(_Group):
    def test_switchover_command(self) -> None:
        """
        C{rmqha cluster switchover}'s work: the target is elected, and
        the status shows it as master with the others following.
        """
        from twisted.internet.defer import ensureDeferred

        from rmqha.coord.cluster import describe, render, switchover

        for name in "abc":
            self.node(name)
        self.elapse(2)
        dcs = MemoryDCS(self.store, "g")
        d = ensureDeferred(switchover(self.clock, dcs, "b", 10, now=self.clock.seconds))
        self.elapse(3)
        result = self.successResultOf(d)
        self.assertEqual((result["master"], result["epoch"]), ("b", 2))
        state = describe(self.successResultOf(dcs.load()))
        self.assertEqual(state["master"]["node_id"], "b")
        self.assertEqual(
            {m["node_id"]: m["role"] for m in state["members"]},
            {"a": "slave", "b": "master", "c": "slave"},
        )
        self.assertIn("master b (b:10912)", render("g", state))

    def test_switchover_refused(self) -> None:
        """
        A switchover to the master itself, to an unknown node, or to a node
        outside the in-sync set is refused with one line; nothing changes.
        """
        from twisted.internet.defer import ensureDeferred

        from rmqha.coord.cluster import ClusterError, switchover

        for name in "ab":
            self.node(name)
        self.elapse(2)
        dcs = MemoryDCS(self.store, "g")
        for target, text in [("a", "is the master already"), ("z", "not a live member")]:
            failure = self.failureResultOf(
                ensureDeferred(switchover(self.clock, dcs, target, 10)), ClusterError
            )
            self.assertIn(text, str(failure.value))
        leader = self.successResultOf(dcs.load()).leader
        assert leader is not None
        self.successResultOf(dcs.publish_in_sync(InSync(1, ("a",)), leader))
        failure = self.failureResultOf(
            ensureDeferred(switchover(self.clock, dcs, "b", 10)), ClusterError
        )
        self.assertIn("not in the in-sync set (a)", str(failure.value))
        self.assertIsNone(self.successResultOf(dcs.load()).switchover)


class ClusterStatusTests(_Group):
    """
    What C{rmqha cluster status} proves about a group (docs/failover.md,
    "Operating it"): who is not reporting, and a group nobody is in.
    """

    def status(self, dcs: MemoryDCS, window: float = 1.0) -> dict[str, Any]:
        from twisted.internet.defer import ensureDeferred

        from rmqha.coord.cluster import status

        d = ensureDeferred(status(dcs, self.clock, window))
        self.elapse(window)
        return self.successResultOf(d)

    def test_dead_master_marked_not_reporting(self) -> None:
        """
        While a crashed master's keys outlive it (until its lease
        expires), status marks it NOT REPORTING -- its member key was not
        rewritten while the live ones were, every renew interval -- in the
        headline and its row; the live members are not marked; before the
        crash nobody was.
        """
        from rmqha.coord.cluster import render

        for name in "abc":
            self.node(name)
        self.elapse(2)
        dcs = MemoryDCS(self.store, "g")
        before = self.status(dcs)
        self.assertEqual([m["reporting"] for m in before["members"]], [True, True, True])
        self.assertNotIn("NOT REPORTING", render("g", before))
        master = self.master()
        assert master is not None
        name = master.coordinator.settings.node_id
        self.crash(master)
        state = self.status(dcs)
        self.assertEqual(state["master"]["node_id"], name)  # (its lease lives on)
        self.assertIs(state["master"]["reporting"], False)
        self.assertEqual(
            {m["node_id"]: m["reporting"] for m in state["members"]},
            {n: n != name for n in "abc"},
        )
        text = render("g", state)
        self.assertIn(
            f"master {name} ({name}:10912; NOT REPORTING for 1 s: dead or cut off from the "
            "coordinator; its keys go when its lease expires)",
            text,
        )
        (row,) = [line for line in text.splitlines() if line.startswith(f"{name} ")]
        self.assertIn("NOT REPORTING for 1 s; master", row)

    def test_unknown_group_named(self) -> None:
        """
        A group no node is registered in (a mistyped --group): status says
        so and names the groups there are, at once (nothing to watch); if
        they cannot be listed, it says so without the list.
        """
        from rmqha.coord.cluster import render

        self.node("a")
        self.elapse(1)
        dcs = MemoryDCS(self.store, "broker-x")
        state = self.status(dcs, window=0)
        self.assertEqual((state["members"], state["groups"]), ([], ["g"]))
        self.assertIn(
            "no node of group broker-x is registered in etcd (groups there: g)",
            render("broker-x", state),
        )
        self.patch(dcs, "groups", lambda: fail(DCSError("etcd: permission denied")))
        state = self.status(dcs, window=0)
        self.assertIsNone(state["groups"])
        self.assertEqual(
            render("broker-x", state).splitlines()[1],
            "no node of group broker-x is registered in etcd",
        )


class TooFewTests(_Group):
    def test_too_few_replicas_not_stored(self) -> None:
        """
        A failover SYNC_MASTER with too few replicas even connected to
        reach minInSyncReplicas refuses a put before storing it (a retry
        makes no duplicate); with minInSyncReplicas 1 it takes it alone.
        """
        from rmqha.broker import NotStoredError

        for name in "ab":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None
        other = next(n for n in self.nodes.values() if n is not master)
        self.crash(other)
        self.elapse(1)
        before = master.broker.commitlog.max_offset
        with self.assertRaises(NotStoredError) as caught:
            self.put(master.broker)
        self.assertIs(caught.exception.status, PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        self.assertEqual(master.broker.commitlog.max_offset, before)
        master.broker.role_service.ha._min_in_sync_replicas = 1  # type: ignore[union-attr]
        d = self.put(master.broker)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)


class UnfitTests(_Group):
    def test_cannot_take_office(self) -> None:
        """
        A node elected that cannot become master (its HA port is taken)
        steps down, says so, and stops standing; another is elected, and
        the unfit one is not elected again.
        """
        from rmqha._ports import ListenFailed

        a = self.node("a")
        b = self.node("b")
        self.elapse(2)
        self.assertIs(self.master(), a)

        def refuse(role: Role, *, epoch: int | None = None, fence: object = None) -> Deferred[None]:
            raise ListenFailed("ha", "tcp:10912", "address already in use")

        b.broker.become_master = refuse  # type: ignore[method-assign]
        self.crash(a)
        self.elapse(4)
        self.assertIsNone(self.master())
        self.assertEqual(b.coordinator.counts["elected"], 1)
        self.assertIn("could not become master", b.coordinator.note or "")
        self.assertFalse(b.coordinator.member().electable)
        # A fresh node lacks what b holds: not eligible either (only an
        # operator, or --allow-unclean-election, can decide).
        c = self.node("c", min_in_sync_replicas=1)
        self.elapse(4)
        self.assertIsNone(self.master())
        self.assertIn("not eligible", c.coordinator.note or "")
        self.assertEqual(b.coordinator.counts["elected"], 1)

    def test_next_member_stands_when_the_winner_cannot(self) -> None:
        """
        The winner of an election cannot take office (its epoch file cannot
        be written): it steps down and stops standing, and the next live
        member of the old in-sync set -- kept in the new epoch's set by the
        campaign -- is elected within one lease, with every PUT_OK.
        (Before, the campaign set the winner alone in sync, and the group
        had no master until an operator restarted the winner.)
        """
        a, end = self.three_with_acked_puts()
        b, c = sorted((n for n in self.nodes.values() if n is not a), key=lambda n: n.id)

        def refuse(role: Role, *, epoch: int | None = None, fence: object = None) -> Deferred[None]:
            return fail(OSError(f"cannot write epoch {epoch}: No space left on device"))

        b.broker.become_master = refuse  # type: ignore[method-assign]
        self.crash(a)
        self.elapse(3)  # (the lease runs out; b wins first: the lower id)
        self.assertEqual(b.coordinator.counts["elected"], 1)
        self.assertIn("No space left on device", b.coordinator.status()["unfit"] or "")
        self.assertFalse(b.coordinator.member().electable)
        self.elapse(2)  # (within one lease of b stepping down)
        self.assertIs(self.master(), c)
        view = self.successResultOf(c.dcs.load())
        self.assertEqual(view.epoch, 3)
        self.assertGreaterEqual(c.broker.commitlog.max_offset, end)

    def test_damaged_store_steps_down(self) -> None:
        """
        The master's live segment is cut under it (issue 25, item 8): its
        store refuses writes, so it steps down, says why, stops standing,
        and another in-sync member leads with every PUT_OK.
        """
        import os

        a, end = self.three_with_acked_puts()
        directory = a.broker.commitlog.commitlog_dir
        live = sorted(os.listdir(directory))[-1]
        os.truncate(os.path.join(directory, live), 100)
        self.elapse(4)
        new = self.master()
        assert new is not None and new is not a
        self.assertIn(live, a.coordinator.status()["unfit"] or "")
        self.assertFalse(a.coordinator.member().electable)
        self.assertGreaterEqual(new.broker.commitlog.max_offset, end)

    def test_winner_dying_at_once_does_not_wedge(self) -> None:
        """
        The winner dies while it takes office (its flush hangs, then it is
        killed), before it answered any put: another member of the old set
        stands (it holds every PUT_OK), within one lease.
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        a = self.master()
        assert a is not None
        self.assertEqual(a.id, "a")
        b, c = self.nodes["b"], self.nodes["c"]
        b.broker.become_master = lambda role, *, epoch=None, fence=None: Deferred()  # type: ignore[method-assign]
        self.crash(a)
        self.elapse(3)
        self.assertEqual(b.coordinator.counts["elected"], 1)
        published = self.successResultOf(c.dcs.load()).in_sync
        self.assertEqual(published, InSync(2, ("b", "c")))
        self.crash(b)
        self.elapse(4)
        self.assertIs(self.master(), c)

    def test_unclean_election(self) -> None:
        """
        With every in-sync member gone, nobody is elected, unless a node
        allows an unclean election.
        """
        a = self.node("a")
        self.node("b")
        self.elapse(2)
        self.crash(a)
        self.crash(self.nodes["b"])
        self.node("c", min_in_sync_replicas=1)
        self.elapse(4)
        self.assertIsNone(self.master())
        self.node("d", min_in_sync_replicas=1, allow_unclean_election=True)
        self.elapse(4)
        master = self.master()
        assert master is not None
        self.assertEqual(master.id, "d")


class LostAnswerTests(_Group):
    """
    A campaign whose transaction succeeds in the DCS but whose answer never
    reaches the node (a request timeout under load).
    """

    def test_takes_office_it_won(self) -> None:
        """
        The node recognises the leader key on its own lease as its win and
        takes office at that epoch, instead of waiting forever for a lease
        it renews itself to expire; the others follow it.
        """
        a = self.node("a", lose_campaign_answer=True)
        for name in "bc":
            self.node(name)
        self.elapse(3)
        self.assertEqual([(node, won is not None) for node, won in self.lost_wins], [("a", True)])
        self.assertIs(self.master(), a)
        self.assertEqual(a.coordinator.leader.epoch, 1)  # type: ignore[union-attr]
        self.assertIsNone(a.coordinator.note)
        for name in "bc":
            self.assertEqual(self.nodes[name].coordinator.following, "a:10912")
        d = self.put(a.broker)
        self.elapse(0.5)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_unfit_node_resigns_what_it_won(self) -> None:
        """
        A node that may no longer lead when it finds its lost win (here
        it is not electable any more) deletes the leader key, so another
        node is elected without waiting for a lease that never expires.
        """
        a = self.node("a", lose_campaign_answer=True)
        a.coordinator._unfit = "could not become master: test"
        self.elapse(0.5)
        self.assertEqual([(node, won is not None) for node, won in self.lost_wins], [("a", True)])
        self.assertIsNone(self.successResultOf(a.dcs.load()).leader)
        # (Only a held every put of epoch 1: another node needs an unclean
        # election, and gets it at once, not after a's lease.)
        self.node("b", allow_unclean_election=True)
        self.elapse(3)
        master = self.master()
        assert master is not None
        self.assertEqual(master.id, "b")
        self.assertEqual(master.coordinator.leader.epoch, 2)  # type: ignore[union-attr]
        self.assertEqual(a.coordinator.counts["elected"], 0)

    def test_other_incarnation_waits(self) -> None:
        """
        A node restarted (a new lease) while the key its earlier
        incarnation holds still lives waits for that lease to expire, then
        stands again.
        """
        a = self.node("a", min_in_sync_replicas=1)
        self.elapse(2)
        self.assertIs(self.master(), a)
        self.crash(a)
        again = self.node("a", min_in_sync_replicas=1)
        self.elapse(0.5)
        self.assertIsNone(self.master())
        # (Its member key is on the old lease too: it waits for that first.)
        self.assertIn("node id a is held by lease", again.coordinator.note or "")
        self.elapse(4)
        self.assertIs(self.master(), again)
        self.assertEqual(again.coordinator.leader.epoch, 2)  # type: ignore[union-attr]
        self.assertIsNone(again.coordinator.fatal)

    def test_duplicate_node_id_refuses_to_run(self) -> None:
        """
        A second process started with a node id that is live in the group
        (its key renewed every interval) does not join: one line naming the
        holder's addresses, its own lease revoked, the holder's key and
        role untouched (before, both wrote the key: it flapped, 21
        "replaced by" lines in 8 s).
        """
        a = self.node("a")
        b = self.node("b")
        self.elapse(2)
        master = self.master()
        assert master is not None
        fatal: list[str] = []
        broker = self.coordinated_broker("a")
        self.addCleanup(self.stop, broker)
        twin = Coordinator(
            self.clock,
            MemoryDCS(self.store, "g"),
            broker,
            FailoverSettings("g", "a", "a-twin:10912"),
            self.dial,
            now=self.clock.seconds,
            wall=self.clock.seconds,
            on_fatal=fatal.append,
        )
        twin.startService()
        self.addCleanup(twin.stopService)
        self.elapse(3)
        self.assertEqual(len(fatal), 1)
        self.assertIn("node id a is already live in group g", fatal[0])
        self.assertIn("HA a:10912", fatal[0])
        self.assertNotIn("\n", fatal[0])
        self.assertEqual(twin.status()["fatal"], fatal[0])
        view = self.successResultOf(a.dcs.load())
        self.assertEqual(view.members["a"].ha, "a:10912")
        self.assertIs(self.master(), master)
        self.assertIsNone(broker.role_service)
        self.assertEqual(b.coordinator.counts["elected"] + a.coordinator.counts["elected"], 1)


class ClassicSlaveTests(_Group):
    def test_classic_slave_follows_but_never_counts(self) -> None:
        """
        A slave speaking only the classic protocol (as a genuine RocketMQ
        4.9 slave does) replicates from a failover master, but is never in
        the in-sync set and never makes a put PUT_OK.
        """
        from rmqha.broker import NotStoredError

        self.node("a")
        self.node("b")
        self.elapse(2)
        master = self.master()
        assert master is not None
        classic = self.uncoordinated_slave(master, master_kind="rocketmq")
        d = self.put(master.broker)
        self.elapse(0.5)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        self.assertEqual(classic.commitlog.max_offset, master.broker.commitlog.max_offset)
        self.assertEqual(master.coordinator.in_sync.effective, {"a", "b"})  # type: ignore[union-attr]
        other = next(n for n in self.nodes.values() if n is not master)
        self.crash(other)
        self.elapse(1)
        with self.assertRaises(NotStoredError):
            self.put(master.broker)


class ImpersonationTests(_Group):
    def test_declared_id_must_be_a_member_at_its_host(self) -> None:
        """
        A replica declaring a node id counts for the in-sync set only if
        that id is a live member of the group (not the master itself): a
        peer declaring a made-up id (here: "b", while no node b runs) is
        not counted, so it can neither enter the set nor make a put
        PUT_OK.
        """
        from rmqha.broker import NotStoredError
        from rmqha.coord.dcs import ClusterView, Member

        a = self.node("a")
        self.elapse(2)
        self.assertIs(self.master(), a)
        intruder = self.uncoordinated_slave(a, node_id="b", master_kind="rmqha")
        self.elapse(1)
        factory = a.broker.master_factory
        assert factory is not None
        self.assertEqual([c.failover_node for c in factory.connections if c.replicating], ["b"])
        self.assertEqual(factory.replicas.node_acks(), {})
        self.assertEqual(a.coordinator.in_sync.effective, {"a"})  # type: ignore[union-attr]
        with self.assertRaises(NotStoredError):
            self.put(a.broker)
        coordinator = a.coordinator
        coordinator.view = ClusterView(
            None, 1, 1, None, {"b": Member("b", "10.0.0.2:10912")}, None, 1
        )
        self.assertTrue(coordinator.accepts_node("b", "10.0.0.3"))
        self.assertFalse(coordinator.accepts_node("d", "10.0.0.2"))
        self.assertFalse(coordinator.accepts_node("a", "127.0.0.1"))


class MalformedKeyTests(_Group):
    """
    A key whose value cannot be read never stops an election for good
    (docs/failover.md, "Malformed keys"): it is skipped, warned about once,
    and what it means for the election is decided per key.
    """

    def put_raw(self, name: str, value: bytes) -> None:
        key = f"/rmqha/g/{name}"
        self.store.begin()
        self.store.put(key, value)
        self.store.commit([key])

    def warnings(self) -> list[str]:
        from twisted.logger import LogLevel, formatEvent, globalLogPublisher

        events: list[str] = []

        def observe(event: dict[str, Any]) -> None:
            if event.get("log_level") is LogLevel.warn:
                events.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        return events

    def test_malformed_member_skipped(self) -> None:
        """
        A malformed member key (an unknown node's) does not stop the first
        election; each node warns about it once, however often it loads.
        """
        warned = self.warnings()
        self.put_raw("members/ghost", b"{oops")
        for name in "ab":
            self.node(name)
        self.elapse(3)
        master = self.master()
        assert master is not None
        self.assertEqual(master.id, "a")
        about = [w for w in warned if "/rmqha/g/members/ghost" in w]
        self.assertEqual(len(about), 2, about)
        self.assertIn("malformed and skipped: not JSON", about[0])

    def test_malformed_leader_blocks_until_deleted(self) -> None:
        """
        A malformed leader key is a leader nobody can follow or replace: no
        node campaigns (the note names the key), even with unclean
        elections allowed; once deleted, a node is elected.
        """
        self.put_raw("leader", b'{"node_id": 7}')
        for name in "ab":
            self.node(name, allow_unclean_election=True)
        self.elapse(3)
        self.assertIsNone(self.master())
        note = self.nodes["a"].coordinator.note or ""
        self.assertIn("key /rmqha/g/leader is malformed (node_id is not a string", note)
        self.assertEqual(self.nodes["a"].coordinator.counts["campaigns_lost"], 0)
        self.store.begin()
        self.store.delete("/rmqha/g/leader")
        self.store.commit(["/rmqha/g/leader"])
        self.elapse(2)
        master = self.master()
        assert master is not None
        self.assertEqual(master.coordinator.leader.epoch, 1)  # type: ignore[union-attr]

    def test_leader_key_overwritten_under_the_master(self) -> None:
        """
        The master's leader key overwritten with junk (same
        create_revision): the master steps down and its resign removes the
        junk, so the group elects again instead of staying masterless.
        """
        for name in "ab":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        self.put_raw("leader", b"junk")
        self.elapse(3)
        self.assertEqual(old.coordinator.counts["stepped_down"], 1)
        new = self.master()
        assert new is not None
        self.assertEqual(new.coordinator.leader.epoch, 2)  # type: ignore[union-attr]
        self.assertEqual(self.successResultOf(new.dcs.load()).malformed, ())

    def test_malformed_epoch_refuses_to_campaign(self) -> None:
        """
        A malformed epoch counter stops every campaign (an epoch must never
        repeat), the note naming the key; once an operator writes a number
        back, the next election takes the epoch after it.
        """
        a = self.node("a")
        self.elapse(2)
        self.assertIs(self.master(), a)
        self.crash(a)
        self.put_raw("epoch", b"seven")
        b = self.node("b", allow_unclean_election=True)
        self.elapse(4)
        self.assertIsNone(self.master())
        self.assertIn("key /rmqha/g/epoch is malformed (not a decimal epoch", b.coordinator.note or "")
        self.assertIn("epochs must never repeat", b.coordinator.note or "")
        self.put_raw("epoch", b"7")
        self.elapse(2)
        self.assertIs(self.master(), b)
        self.assertEqual(b.coordinator.leader.epoch, 8)  # type: ignore[union-attr]

    def test_rank_with_malformed_keys(self) -> None:
        """
        rank(): a malformed insync key is no in-sync set (nobody, unless
        unclean); a malformed epoch or leader key: nobody, even unclean.
        """
        from rmqha.coord.dcs import ClusterView, Malformed, Member

        members = {"a": Member("a", "a:1"), "b": Member("b", "b:1")}

        def view(name: str) -> ClusterView:
            bad = Malformed(name, f"/rmqha/g/{name}", "not JSON: b'x'", revision=4)
            return ClusterView(None, 0, 0, None, members, None, 10, (bad,), 1)

        self.assertEqual(rank(view("insync"), False)[0], [])
        self.assertIn("no in-sync set known", rank(view("insync"), False)[1])
        self.assertEqual([m.node_id for m in rank(view("insync"), True)[0]], ["a", "b"])
        for name in ("epoch", "leader"):
            eligible, why = rank(view(name), True)
            self.assertEqual(eligible, [], name)
            self.assertIn(f"key /rmqha/g/{name} is malformed", why)
        # (Without the report, an empty group lets every live node stand.)
        self.assertEqual(len(rank(ClusterView(None, 0, 0, None, members, None, 10), False)[0]), 2)

    def test_cluster_commands_show_malformed_keys(self) -> None:
        """
        C{rmqha cluster status} lists malformed keys (key and reason, text
        and JSON; the epoch unknown when its key is the bad one), and
        C{rmqha cluster switchover} refuses while the switchover key is
        malformed, saying how to delete it.
        """
        from twisted.internet.defer import ensureDeferred

        from rmqha.coord.cluster import ClusterError, describe, render, switchover

        for name in "ab":
            self.node(name)
        self.elapse(2)
        self.put_raw("switchover", b"[1]")
        dcs = MemoryDCS(self.store, "g")
        state = describe(self.successResultOf(dcs.load()))
        self.assertEqual(state["malformed"], [
            {"key": "/rmqha/g/switchover", "reason": "not a JSON object: b'[1]'"},
        ])
        self.assertEqual((state["malformed_total"], state["epoch"]), (1, 1))
        self.assertIn(
            "malformed key /rmqha/g/switchover (skipped): not a JSON object", render("g", state)
        )
        failure = self.failureResultOf(
            ensureDeferred(switchover(self.clock, dcs, "b", 10)), ClusterError
        )
        self.assertIn("delete it first (etcdctl del /rmqha/g/switchover)", str(failure.value))
        self.put_raw("epoch", b"x")
        state = describe(self.successResultOf(dcs.load()))
        self.assertIsNone(state["epoch"])
        self.assertIn("group g: epoch unknown, master a", render("g", state))
