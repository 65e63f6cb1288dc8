"""
The put path's parts are wired at construction through interfaces
(L{rmqha.ha.interfaces}; docs/architecture.md, "How the parts are wired"):
what a part needs is checked when it is built, and no product code assigns
a callable onto another object afterwards.
"""

from __future__ import annotations

import ast
import pathlib

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

import rmqha
from rmqha.ha.fence import OPEN, Fence
from rmqha.ha.group import HAService
from rmqha.ha.insync import InSyncSet
from rmqha.ha.master import MasterFactory
from rmqha.ha.replicas import EarlyFrames, Replicas

from tests._helpers import StubAcks, StubAppended, open_store


def _ha(clock: Clock, **kwargs: object) -> HAService:
    options: dict[str, object] = dict(
        acks=StubAcks(),
        appended=StubAppended(),
        sync=True,
        in_sync_replicas=2,
        min_in_sync_replicas=1,
        slave_fallbehind_max=1 << 20,
        slave_timeout=3.0,
    )
    options.update(kwargs)
    return HAService(clock, **options)  # type: ignore[arg-type]


class CheckedAtConstructionTests(SynchronousTestCase):
    """
    A provider that lacks what its interface promises is refused when the
    part is built, in one line naming the parameter and the interface.
    """

    def test_acks(self) -> None:
        with self.assertRaises(TypeError) as caught:
            _ha(Clock(), acks=object())
        self.assertIn("acks must provide IReplicaAcks", str(caught.exception))

    def test_appended(self) -> None:
        with self.assertRaises(TypeError) as caught:
            _ha(Clock(), appended=object())
        self.assertIn("appended must provide IAppendedTo", str(caught.exception))

    def test_fence(self) -> None:
        with self.assertRaises(TypeError) as caught:
            _ha(Clock(), fence=object())
        self.assertIn("fence must provide IFence", str(caught.exception))

    def test_release_listener(self) -> None:
        with self.assertRaises(TypeError) as caught:
            _ha(Clock(), listener=object())
        self.assertIn("listener must provide IReleaseListener", str(caught.exception))

    def test_in_sync_observer(self) -> None:
        """
        An HA service takes an in-sync set only if the set tells it of its
        changes.
        """
        clock = Clock()
        ha = _ha(clock)
        blind = InSyncSet(clock, "m", lambda members: None, fallbehind_max=1)  # type: ignore[arg-type,return-value]
        with self.assertRaises(ValueError):
            ha.use_in_sync(blind)
        told = InSyncSet(clock, "m", lambda members: None, fallbehind_max=1, observers=(ha,))  # type: ignore[arg-type,return-value]
        ha.use_in_sync(told)
        self.assertIs(ha.in_sync, told)

    def test_factory_reads_what_the_ha_service_reads(self) -> None:
        """
        A master factory feeding an HA service must register its
        connections where that service reads the acks.
        """
        clock = Clock()
        log = open_store(self)
        replicas = Replicas(clock, log)
        ha = _ha(clock, acks=replicas, appended=log)
        with self.assertRaises(ValueError):
            MasterFactory(log, clock, ha=ha)
        with self.assertRaises(ValueError):
            MasterFactory(log, clock, ha=ha, replicas=Replicas(clock, log))
        factory = MasterFactory(
            log, clock, ha=ha, replicas=replicas, early=EarlyFrames(clock, replicas, log)
        )
        self.assertIs(factory.connections, replicas.connections)


class FenceTests(SynchronousTestCase):
    """
    L{Fence}: what the failover coordinator writes, as the put path reads
    it.
    """

    def test_open(self) -> None:
        self.assertIsNone(OPEN.refusing())
        self.assertTrue(OPEN.may_acknowledge())
        self.assertTrue(OPEN.accepts_node("x", "10.0.0.1"))

    def test_lease(self) -> None:
        clock = Clock()
        fence = Fence("a", clock.seconds)
        self.assertEqual(fence.refusing(), "this node is not the elected master")
        self.assertFalse(fence.may_acknowledge())
        fence.elected = True
        fence.valid_until = 5.0
        self.assertIsNone(fence.refusing())
        self.assertTrue(fence.may_acknowledge())
        clock.advance(5.0)
        self.assertEqual(
            fence.refusing(), "this master's lease is not renewed: it no longer takes puts"
        )
        self.assertFalse(fence.may_acknowledge())

    def test_handover(self) -> None:
        clock = Clock()
        fence = Fence("a", clock.seconds)
        fence.elected, fence.valid_until, fence.handing_over = True, 5.0, "b"
        self.assertEqual(fence.refusing(), "handing over to b (switchover)")
        # (Puts stored before the handover may still be acknowledged.)
        self.assertTrue(fence.may_acknowledge())

    def test_members(self) -> None:
        fence = Fence("a", Clock().seconds)
        fence.members = frozenset({"a", "b"})
        self.assertTrue(fence.accepts_node("b", "10.0.0.3"))
        self.assertFalse(fence.accepts_node("a", "10.0.0.1"))
        self.assertFalse(fence.accepts_node("c", "10.0.0.4"))


def _assigned_callables(source: str) -> list[str]:
    """
    Every assignment of a lambda, or of one of the enclosing class's own
    methods (C{self.method}), onto an attribute of another object.
    """
    found: list[str] = []
    tree = ast.parse(source)
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {
            f.name
            for f in cls.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not any(
                isinstance(d, (ast.Name, ast.Attribute)) and ast.unparse(d).endswith(("property", "setter"))
                for d in f.decorator_list
            )
        }
        for node in ast.walk(cls):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            bound = (
                isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and value.value.id == "self"
                and value.attr in methods
            )
            if not (bound or isinstance(value, ast.Lambda)):
                continue
            for target in node.targets:
                if isinstance(target, ast.Attribute) and not (
                    isinstance(target.value, ast.Name) and target.value.id == "self"
                ):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


class NothingAssignedTests(SynchronousTestCase):
    """
    No product code wires parts by assigning callables onto them.
    """

    def test_finds_what_it_looks_for(self) -> None:
        source = (
            "class A:\n"
            "    def m(self): pass\n"
            "    def wire(self, ha):\n"
            "        ha.max_offset = lambda: 0\n"
            "        ha.before_last = self.m\n"
            "        self.own = self.m\n"
        )
        self.assertEqual(
            _assigned_callables(source),
            ["4: ha.max_offset = lambda: 0", "5: ha.before_last = self.m"],
        )

    def test_product(self) -> None:
        root = pathlib.Path(rmqha.__file__).parent
        found = {
            str(path.relative_to(root)): lines
            for path in sorted(root.rglob("*.py"))
            if (lines := _assigned_callables(path.read_text()))
        }
        self.assertEqual(found, {})
