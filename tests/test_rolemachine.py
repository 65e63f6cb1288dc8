"""
Tests for the broker's role state machine (L{rmqha.ha.roles}): every
(state, input) pair, with the running change's step -- the old service
stopping, the promotion's flush and epoch write -- left pending while the
next input arrives; and the reported race on a real broker (stand_by while
become_master is flushing ended with a listening master side).
"""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.ha.epochs import EpochFile
from rmqha.ha.masterside import MasterSide
from rmqha.ha.roles import STOP_TIMEOUT, RoleMachine, RoleState, Superseded
from rmqha.store.commitlog import CommitLog

from tests._helpers import fixed_clock, make_message


class _Service:
    """
    A role service whose stop is held until the test releases it.
    """

    def __init__(self, kind: str, host: "_Host", detail: Any = None) -> None:
        self.kind = kind
        self.detail = detail
        self.running = False
        self.stopping: Deferred[None] | None = None
        self._host = host
        self.ha = self  # (a master side's HAService: .sync)
        self.sync = False

    def startService(self) -> None:
        self.running = True
        self._host.started.append(self)

    def stopService(self) -> Deferred[None]:
        self.running = False
        d: Deferred[None] = Deferred()
        if self._host.hold_stops:
            self.stopping = d
            self._host.held.append(d)
        else:
            d.callback(None)
        return d


class _Host:
    def __init__(self) -> None:
        self.hold_stops = False
        self.hold_promotion = False
        self.fail_promotion = False
        self.held: list[Deferred[None]] = []
        self.started: list[_Service] = []
        self.promotions: list[tuple[bool, int | None]] = []

    def master_side(self, role: Role, fence: object = None) -> _Service:
        return _Service("master", self, role)

    def replica(self, endpoint: Any, leader: object = None) -> _Service:
        return _Service("slave", self, endpoint)

    def start_master_side(self, side: _Service) -> None:
        side.startService()

    def prepare_promotion(self, from_master: bool, epoch: int | None) -> Deferred[None]:
        self.promotions.append((from_master, epoch))
        if self.fail_promotion:
            d: Deferred[None] = Deferred()
            d.errback(OSError("cannot write the epoch file: No space left on device"))
            return d
        if self.hold_promotion:
            d = Deferred()
            self.held.append(d)
            return d
        return succeed(None)

    def release(self) -> None:
        while self.held:
            self.held.pop(0).callback(None)


INPUTS = ("promote", "follow", "stand_by", "stop")
STARTS = (RoleState.STANDBY, RoleState.SLAVE, RoleState.MASTER)


class MachineTests(SynchronousTestCase):
    def machine(self, start: RoleState) -> tuple[RoleMachine, _Host]:
        host = _Host()
        clock = Clock()
        self.clock = clock
        role = Role.SYNC_MASTER if start is RoleState.MASTER else Role.SLAVE
        machine = RoleMachine(host, role, clock)  # type: ignore[arg-type]
        service = None
        if start is RoleState.MASTER:
            service = _Service("master", host, role)
        elif start is RoleState.SLAVE:
            service = _Service("slave", host, "old-master")
        if service is not None:
            service.startService()
        machine.started(service, "old-master" if start is RoleState.SLAVE else None)
        return machine, host

    def give(self, machine: RoleMachine, name: str) -> Deferred[None]:
        if name == "promote":
            return machine.promote(Role.SYNC_MASTER, epoch=7)
        if name == "follow":
            return machine.follow("new-master", ("b", 7))
        if name == "stand_by":
            return machine.stand_by()
        return machine.stop()

    def check_settled(self, machine: RoleMachine, host: _Host, last: str) -> None:
        """
        The machine carried out C{last}; one service at most runs, and it
        is the one the state says.
        """
        running = [s for s in host.started if s.running]
        self.assertLessEqual(len(running), 1, [s.kind for s in running])
        expected = {
            "promote": RoleState.MASTER,
            "follow": RoleState.SLAVE,
            "stand_by": RoleState.STANDBY,
            "stop": RoleState.STOPPED,
        }[last]
        self.assertIs(machine.state, expected)
        if expected is RoleState.MASTER:
            self.assertEqual([s.kind for s in running], ["master"])
            self.assertIs(machine.service, running[0])
            self.assertIs(machine.role, Role.SYNC_MASTER)
            self.assertFalse(machine.is_slave)
        elif expected is RoleState.SLAVE:
            self.assertEqual([(s.kind, s.detail) for s in running], [("slave", "new-master")])
            self.assertEqual((machine.endpoint, machine.leader), ("new-master", ("b", 7)))
            self.assertIs(machine.role, Role.SLAVE)
        else:
            self.assertEqual(running, [])
            self.assertIsNone(machine.service)
            self.assertTrue(machine.is_slave or expected is RoleState.STOPPED)

    def test_every_input_from_every_state(self) -> None:
        """
        With nothing pending, each input from each settled state ends in
        that input's state.
        """
        for start, name in itertools.product(STARTS, INPUTS):
            machine, host = self.machine(start)
            d = self.give(machine, name)
            self.successResultOf(d)
            self.check_settled(machine, host, name)

    def test_every_interleaving_with_the_first_step_pending(self) -> None:
        """
        From each settled state, a first input whose step is held (the
        old service stopping, or the promotion's flush), then a second
        input -- and a third -- before it is released: the newest wins,
        every replaced input fails with Superseded, no superseded role's
        service is ever started, and a stop always ends STOPPED.
        """
        cases = 0
        for start, first, second, third in itertools.product(
            STARTS, INPUTS[:3], INPUTS, (None, *INPUTS)
        ):
            if third is not None and second == "stop":
                continue  # (nothing can follow a stop)
            machine, host = self.machine(start)
            host.hold_stops = host.hold_promotion = True
            d1 = self.give(machine, first)
            if host.held:
                self.assertIs(machine.state, RoleState.CHANGING, (start, first))
            d2 = self.give(machine, second)
            d3 = self.give(machine, third) if third is not None else None
            for _ in range(4):  # (each step may hold another)
                host.release()
            last = third or second
            self.check_settled(machine, host, last)
            results = [d for d in (d1, d2, d3) if d is not None]
            self.successResultOf(results[-1])
            # Each earlier input either took effect (its step was running)
            # or was replaced: Superseded, never left hanging.
            for d in results[:-1]:
                ended: list[object] = []
                d.addBoth(ended.append)
                self.assertEqual(len(ended), 1, (start, first, second, third))
                if ended[0] is not None:
                    self.assertTrue(ended[0].check(Superseded), ended[0])  # type: ignore[attr-defined]
            if last == "stop":
                self.assertRaises(RuntimeError, machine.stand_by)
            cases += 1
        self.assertGreater(cases, 100)

    def test_stand_by_while_promotion_flushes(self) -> None:
        """
        The race the issue reports: stand_by while a promotion flushes.
        The promotion fails Superseded, no master side is ever started, and
        the machine stands by.
        """
        machine, host = self.machine(RoleState.SLAVE)
        host.hold_promotion = True
        promoted = machine.promote(Role.SYNC_MASTER, epoch=3)
        self.assertIs(machine.state, RoleState.CHANGING)
        stood = machine.stand_by()
        self.assertNoResult(stood)
        host.release()
        self.failureResultOf(promoted, Superseded)
        self.successResultOf(stood)
        self.assertEqual([s.kind for s in host.started], ["slave"])
        self.assertIs(machine.state, RoleState.STANDBY)
        self.assertIs(machine.role, Role.SLAVE)

    def test_failed_promotion_stands_by(self) -> None:
        """
        A promotion whose epoch cannot be recorded fails with the error and
        leaves the machine standing by (no master side); a re-election that
        fails leaves the master as it was.
        """
        machine, host = self.machine(RoleState.SLAVE)
        host.fail_promotion = True
        self.failureResultOf(machine.promote(Role.SYNC_MASTER, epoch=3), OSError)
        self.assertIs(machine.state, RoleState.STANDBY)
        self.assertIsNone(machine.service)
        machine, host = self.machine(RoleState.MASTER)
        side = machine.service
        host.fail_promotion = True
        self.failureResultOf(machine.promote(Role.ASYNC_MASTER, epoch=4), OSError)
        self.assertIs(machine.state, RoleState.MASTER)
        self.assertIs(machine.service, side)
        self.assertTrue(side.running)

    def test_re_election_keeps_serving(self) -> None:
        """
        A master promoted again (re-elected) keeps its side running while
        the new epoch is recorded; only the sync flag follows the role.
        """
        machine, host = self.machine(RoleState.MASTER)
        side = machine.service
        host.hold_promotion = True
        d = machine.promote(Role.ASYNC_MASTER, epoch=9)
        self.assertTrue(side.running)
        host.release()
        self.successResultOf(d)
        self.assertIs(machine.service, side)
        self.assertIs(machine.role, Role.ASYNC_MASTER)
        self.assertEqual(host.promotions, [(True, 9)])

    def test_listeners(self) -> None:
        """
        Listeners hear every state the machine takes, the changing one
        included; one that raises is logged and the others still hear.
        """
        machine, host = self.machine(RoleState.SLAVE)
        heard: list[RoleState] = []

        def broken(state: RoleState) -> None:
            raise RuntimeError("boom")

        machine.listeners += [broken, heard.append]
        self.successResultOf(machine.promote(Role.SYNC_MASTER, epoch=7))
        self.successResultOf(machine.follow("new-master", ("b", 7)))
        self.successResultOf(machine.stand_by())
        self.successResultOf(machine.stop())
        self.assertEqual(
            heard,
            [RoleState.CHANGING, RoleState.MASTER, RoleState.CHANGING, RoleState.SLAVE,
             RoleState.CHANGING, RoleState.STANDBY, RoleState.STOPPED],
        )
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 7)

    def test_stop_waits_for_the_running_step(self) -> None:
        """
        stop() while a promotion flushes: the flush finishes, the waiting
        input is superseded, no master side starts, STOPPED.
        """
        machine, host = self.machine(RoleState.SLAVE)
        host.hold_promotion = True
        promoted = machine.promote(Role.SYNC_MASTER, epoch=3)
        follow = machine.follow("x")
        stopped = machine.stop()
        self.failureResultOf(follow, Superseded)
        self.assertNoResult(stopped)
        host.release()
        self.successResultOf(stopped)
        self.failureResultOf(promoted, Superseded)
        self.assertIs(machine.state, RoleState.STOPPED)
        self.assertEqual([s.kind for s in host.started], ["slave"])

    def test_stuck_stop_is_bounded(self) -> None:
        """
        An old service whose stop never finishes (a connection to a peer
        cut off) holds a change up for STOP_TIMEOUT at most.
        """
        machine, host = self.machine(RoleState.MASTER)
        host.hold_stops = True
        d = machine.follow("new-master")
        self.assertNoResult(d)
        self.clock.advance(STOP_TIMEOUT)
        self.successResultOf(d)
        self.assertIs(machine.state, RoleState.SLAVE)


class BrokerRaceTests(SynchronousTestCase):
    """
    The race on a real broker: its flushes held in a thread pool stand-in.
    """

    def test_stand_by_while_become_master_flushes(self) -> None:
        reactor = MemoryReactorClock()
        store = self.mktemp()
        flushes: list[tuple[Any, Deferred[None]]] = []

        def held(f: Any) -> Deferred[None]:
            d: Deferred[None] = Deferred()
            flushes.append((f, d))
            return d

        broker = Broker(
            BrokerSettings(role=Role.SYNC_MASTER, ha_listen="tcp:10912", scrub_rate=0),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=held,
            fd_limit=lambda: 4096,
            coordinated=True,
            epochs=EpochFile(store),
        )
        broker.startService()
        # (Replicated bytes not yet flushed: the promotion must flush them.)
        broker.commitlog.put(make_message(b"replicated"))
        promoted = broker.become_master(Role.SYNC_MASTER, epoch=1)
        self.assertNoResult(promoted)
        self.assertTrue(flushes, "the promotion's flush is pending")
        stood = broker.stand_by()
        while flushes:
            f, d = flushes.pop(0)
            f()
            d.callback(None)
        self.failureResultOf(promoted, Superseded)
        self.successResultOf(stood)
        self.assertIsNone(broker.role_service)
        self.assertIsNone(broker.master_factory)
        self.assertIs(broker.role, Role.SLAVE)
        self.assertNotIsInstance(broker.role_service, MasterSide)
        self.assertTrue(broker.scrub.slave)
        stopping = broker.stopService()
        while flushes:
            f, d = flushes.pop(0)
            f()
            d.callback(None)
        self.successResultOf(stopping)
