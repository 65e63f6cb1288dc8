"""
Tests for synchronous double write: L{rmqha.ha.group.GroupTransferService}
on a C{Clock}, and SYNC_MASTER puts through L{rmqha.broker.Broker} with
slaves on C{StringTransport}s.
"""

from __future__ import annotations

import struct

from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import CommitLog
from rmqha.ha.group import GroupTransferService, PutMessageResult, PutStatus
from rmqha.ha.master import EARLY_BYTES, MasterConnection
from rmqha.ha.masterside import MasterSide

from tests._helpers import StubAcks, StubAppended, fixed_clock, settings_and_runtime
from tests.test_master import frames


class GroupTransferServiceTests(SynchronousTestCase):
    """
    Waiters fire when the quorum offset reaches them, or time out.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.group = GroupTransferService(self.clock, timeout=3.0)
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))
        self.addCleanup(self.group.stop)

    def test_fires_with_the_put_result(self) -> None:
        """
        A wait given the put's AppendResult fires with C{finish(status,
        append)} — released, timed out, at once, or stopped — with no
        callback of the caller's in between.
        """
        made: list = []

        def finish(status, append):  # type: ignore[no-untyped-def]
            made.append((status, append))
            return ("result", status, append)

        self.group = GroupTransferService(self.clock, timeout=3.0, finish=finish)
        self.addCleanup(self.group.stop)
        released = self.group.wait_for(100, "a")  # type: ignore[arg-type]
        timed_out = self.group.wait_for(200, "b")  # type: ignore[arg-type]
        self.group.quorum_changed(100)
        self.group.release()
        self.assertEqual(self.successResultOf(released), ("result", PutStatus.PUT_OK, "a"))
        self.assertEqual(
            self.successResultOf(self.group.wait_for(50, "c")),  # type: ignore[arg-type]
            ("result", PutStatus.PUT_OK, "c"),
        )
        self.clock.advance(3.0)
        self.assertEqual(
            self.successResultOf(timed_out), ("result", PutStatus.FLUSH_SLAVE_TIMEOUT, "b")
        )
        stopped = self.group.wait_for(300, "d")  # type: ignore[arg-type]
        self.group.stop()
        self.assertEqual(
            self.successResultOf(stopped), ("result", PutStatus.SLAVE_NOT_AVAILABLE, "d")
        )
        self.assertEqual(len(made), 4)
        # Without a put's AppendResult: the status itself.
        self.assertEqual(self.successResultOf(self.group.wait_for(1)), PutStatus.SLAVE_NOT_AVAILABLE)

    def test_wait_then(self) -> None:
        """
        C{wait_then} answers as C{wait_for} fires, without a Deferred: the
        answer now when it is known (the quorum past the put, the service
        stopped) and C{None} otherwise, then C{answer} called once on
        release, at the timeout or at stop, never when the answer came
        back now.
        """

        def finish(status, append):  # type: ignore[no-untyped-def]
            return (status, append)

        self.group = GroupTransferService(self.clock, timeout=3.0, finish=finish)
        self.addCleanup(self.group.stop)
        answers: list = []
        wait = lambda end, name: self.group.wait_then(end, name, answers.append)  # noqa: E731
        self.assertIsNone(wait(100, "released"))
        self.assertIsNone(wait(200, "timed out"))
        self.group.quorum_changed(100)
        self.assertEqual(answers, [])  # (the firing rule: at release)
        self.group.release()
        self.assertEqual(answers, [(PutStatus.PUT_OK, "released")])
        self.assertEqual(wait(50, "now"), (PutStatus.PUT_OK, "now"))
        self.clock.advance(3.0)
        self.assertEqual(answers[1:], [(PutStatus.FLUSH_SLAVE_TIMEOUT, "timed out")])
        self.assertIsNone(wait(300, "stopped"))
        self.group.stop()
        self.assertEqual(answers[2:], [(PutStatus.SLAVE_NOT_AVAILABLE, "stopped")])
        self.assertEqual(wait(400, "after"), (PutStatus.SLAVE_NOT_AVAILABLE, "after"))
        self.assertEqual(len(answers), 3)
        self.assertEqual(self.group.waiting, 0)

    def test_wait_then_answer_waits_again(self) -> None:
        """
        An answer that waits again (a producer's next put) from inside a
        release: a wait the quorum already covers is answered now, one
        past it waits for the next release; the release goes on with the
        waiters it covers.
        """
        answers: list = []
        again = {100: 150, 120: 200}

        def answer(end):  # type: ignore[no-untyped-def]
            def answered(status):  # type: ignore[no-untyped-def]
                answers.append((end, status))
                if end in again:
                    now = self.group.wait_then(again[end], None, answer(again[end]))  # type: ignore[arg-type]
                    if now is not None:
                        answers.append((again[end], "now", now))

            return answered

        for end in (100, 120):
            self.assertIsNone(self.group.wait_then(end, None, answer(end)))  # type: ignore[arg-type]
        self.group.quorum_changed(160)
        self.group.release()
        ok = PutStatus.PUT_OK
        self.assertEqual(answers, [(100, ok), (150, "now", ok), (120, ok)])
        self.assertEqual(self.group.waiting, 1)  # (200)
        self.group.quorum_changed(200)
        self.group.release()
        self.assertEqual(answers[3:], [(200, ok)])

    def test_wait_then_answer_raises(self) -> None:
        """
        An answer that raises is logged, once; the release, the timer and
        the stop go on answering the other waiters (the replication
        connection that delivered the ack never sees the error).
        """
        answers: list = []

        def broken(status):  # type: ignore[no-untyped-def]
            raise ValueError(f"broken on {status.value}")

        for end, answer in ((100, broken), (110, answers.append), (200, broken),
                            (210, answers.append), (300, broken), (310, answers.append)):
            self.assertIsNone(self.group.wait_then(end, None, answer))  # type: ignore[arg-type]
        self.group.quorum_changed(110)
        self.group.release()
        self.clock.advance(3.0)
        for end, answer in ((400, broken), (410, answers.append)):
            self.assertIsNone(self.group.wait_then(end, None, answer))  # type: ignore[arg-type]
        self.group.stop()
        self.assertEqual(
            answers,
            [
                PutStatus.PUT_OK,
                PutStatus.FLUSH_SLAVE_TIMEOUT,
                PutStatus.FLUSH_SLAVE_TIMEOUT,
                PutStatus.SLAVE_NOT_AVAILABLE,
            ],
        )
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 4)

    def test_fires_on_release(self) -> None:
        """
        The firing rule: a quorum reaching the end offset fires nothing by
        itself (the caller is still parsing); C{release} fires PUT_OK at
        once, without waiting for a reactor turn or scheduling anything.
        """
        d = self.group.wait_for(100)
        self.group.quorum_changed(100)
        self.assertNoResult(d)
        self.group.release()
        self.assertEqual(self.successResultOf(d), PutStatus.PUT_OK)

    def test_already_covered(self) -> None:
        """
        A put whose end the quorum already covers is PUT_OK at once.
        """
        self.group.quorum_changed(500)
        self.assertEqual(self.successResultOf(self.group.wait_for(400)), PutStatus.PUT_OK)

    def test_deadline_exact(self) -> None:
        """
        FLUSH_SLAVE_TIMEOUT exactly at slaveTimeout, not a tick before; an
        ack after the deadline changes nothing.
        """
        d = self.group.wait_for(100)
        self.clock.advance(2.999)
        self.assertNoResult(d)
        self.clock.advance(0.001)
        self.assertEqual(self.successResultOf(d), PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.group.quorum_changed(100)
        self.group.release()
        self.assertEqual(self.group.waiting, 0)

    def test_ack_just_before_deadline(self) -> None:
        """
        An ack a tick before the deadline wins.
        """
        d = self.group.wait_for(100)
        self.clock.advance(2.999)
        self.group.quorum_changed(120)
        self.group.release()
        self.assertEqual(self.successResultOf(d), PutStatus.PUT_OK)

    def test_offset_order_and_partial(self) -> None:
        """
        Waiters fire in end-offset order, and only those the quorum covers.
        """
        order: list[int] = []
        for end in (300, 100, 200, 400):
            self.group.wait_for(end).addCallback(lambda _, e=end: order.append(e))
        self.group.quorum_changed(300)
        self.group.release()
        self.assertEqual(order, [100, 200, 300])
        self.assertEqual(self.group.waiting, 1)
        self.group.quorum_changed(400)
        self.group.release()
        self.assertEqual(order, [100, 200, 300, 400])

    def test_waits_in_offset_order_queue(self) -> None:
        """
        Waits made in offset order -- every put's -- are queued without the
        heap; once every wait has ended (here, cancelled: its entry is
        still there) the queue starts again from the next wait, whatever
        its offset, so one wait far ahead does not send every later one to
        the heap.
        """
        for end in (100, 200, 200, 300):
            self.group.wait_for(end)
        self.assertEqual((len(self.group._queue), len(self.group._heap)), (4, 0))
        self.group.wait_for(150)
        self.assertEqual((len(self.group._queue), len(self.group._heap)), (4, 1))
        self.group.quorum_changed(300)
        self.group.release()
        self.assertEqual(self.group.waiting, 0)
        far = self.group.wait_for(900)
        far.cancel()
        self.failureResultOf(far)
        ds = [self.group.wait_for(end) for end in (400, 500, 600)]
        self.assertEqual((len(self.group._queue), len(self.group._heap)), (3, 0))
        self.group.quorum_changed(600)
        self.group.release()
        self.assertEqual([self.successResultOf(d) for d in ds], [PutStatus.PUT_OK] * 3)

    def test_cancel(self) -> None:
        """
        A cancelled wait is withdrawn (and cancels its deadline).
        """
        d = self.group.wait_for(100)
        d.cancel()
        self.failureResultOf(d)
        self.assertEqual(self.group.waiting, 0)
        many = [self.group.wait_for(1000 + i) for i in range(200)]
        for w in many:
            w.cancel()
            self.failureResultOf(w)
        self.assertEqual(self.group.waiting, 0)

    def test_stop_resolves_everything(self) -> None:
        """
        Stopping resolves every waiter with SLAVE_NOT_AVAILABLE and leaves
        no timers; later waits get the same at once.
        """
        ds = [self.group.wait_for(end) for end in (10, 20)]
        self.group.stop()
        for d in ds:
            self.assertEqual(self.successResultOf(d), PutStatus.SLAVE_NOT_AVAILABLE)
        self.assertEqual(
            self.successResultOf(self.group.wait_for(30)), PutStatus.SLAVE_NOT_AVAILABLE
        )

    def test_one_timer_for_all_waiters(self) -> None:
        """
        The deadline structure: however many puts wait, the clock holds
        one call (not one per put, as C{addTimeout} did), and waiters
        that were acknowledged leave nothing behind once their deadline
        has passed.
        """
        ds = [self.group.wait_for(100 + i) for i in range(100)]
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.group.quorum_changed(10_000)
        self.group.release()
        self.assertEqual([self.successResultOf(d) for d in ds], [PutStatus.PUT_OK] * 100)
        self.clock.advance(3.0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_release_reads_the_clock_once(self) -> None:
        """
        A release that ends many waits reads the clock once for all of
        them (each wait still observed, from its own start), not once per
        put: the per-put cost of a SYNC put (issue 15).
        """
        observed: list[float] = []
        group = GroupTransferService(self.clock, timeout=3.0, observe=observed.append)
        self.addCleanup(group.stop)
        ds = [group.wait_for(100 + i) for i in range(32)]
        self.clock.advance(0.25)
        readings = []
        seconds = self.clock.seconds

        def counted() -> float:
            readings.append(1)
            return seconds()

        self.patch(self.clock, "seconds", counted)
        group.quorum_changed(10_000)
        group.release()
        self.assertEqual([self.successResultOf(d) for d in ds], [PutStatus.PUT_OK] * 32)
        self.assertEqual(len(readings), 1)
        self.assertEqual(observed, [0.25] * 32)

    def test_staggered_deadlines_exact(self) -> None:
        """
        Waiters that started at different times each time out at their own
        deadline (to the microsecond), not at the first one's or a tick
        before; an earlier waiter acked in between does not move the
        timer's aim.
        """
        a = self.group.wait_for(100)
        self.clock.advance(1.0)
        b = self.group.wait_for(200)
        self.clock.advance(0.5)
        c = self.group.wait_for(300)
        self.group.quorum_changed(100)
        self.group.release()
        self.assertEqual(self.successResultOf(a), PutStatus.PUT_OK)
        self.clock.advance(2.499)  # t = 3.999
        self.assertNoResult(b)
        self.clock.advance(0.001)  # t = 4.0
        self.assertEqual(self.successResultOf(b), PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.clock.advance(0.499)  # t = 4.499
        self.assertNoResult(c)
        self.clock.advance(0.001)  # t = 4.5
        self.assertEqual(self.successResultOf(c), PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.assertEqual(self.group.waiting, 0)

    def test_resolved_waiters_do_not_accumulate(self) -> None:
        """
        With no slave acking, puts keep timing out; with one, acked and
        cancelled waits are dropped: the structures track the live
        waiters, not every put ever made.
        """
        for round in range(50):
            for i in range(40):
                self.group.wait_for(1_000_000 + round * 100 + i)
            self.clock.advance(3.0)
        self.assertEqual(self.group.waiting, 0)
        for i in range(1000):
            d = self.group.wait_for(2_000_000 + i)
            if i % 2:
                d.cancel()
                self.failureResultOf(d)
        self.group.quorum_changed(3_000_000)
        self.group.release()
        self.assertLess(
            len(self.group._queue) + len(self.group._heap) + len(self.group._late), 200
        )

    def test_callback_stops_the_service(self) -> None:
        """
        A waiter's callback that stops the service (the broker stopping
        inside a put's callback) ends the other waiters with
        SLAVE_NOT_AVAILABLE, cleanly, in the middle of a release.
        """
        first = self.group.wait_for(100)
        second = self.group.wait_for(200)
        third = self.group.wait_for(300)
        first.addCallback(lambda status: (self.group.stop(), status)[1])
        self.group.quorum_changed(200)
        self.group.release()
        self.assertEqual(self.successResultOf(first), PutStatus.PUT_OK)
        self.assertEqual(self.successResultOf(second), PutStatus.SLAVE_NOT_AVAILABLE)
        self.assertEqual(self.successResultOf(third), PutStatus.SLAVE_NOT_AVAILABLE)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_timeout_callback_waits_again(self) -> None:
        """
        A put that times out and whose callback waits again (a producer's
        next put) gets a deadline of its own, and waiters behind the timed
        out one still time out on time.
        """
        again: list = []
        a = self.group.wait_for(100)
        a.addCallback(lambda _: again.append(self.group.wait_for(400)))
        self.clock.advance(1.0)
        b = self.group.wait_for(200)
        self.clock.advance(2.0)  # t = 3: a times out, waits again
        self.assertEqual(self.successResultOf(a), None)
        self.assertNoResult(b)
        self.clock.advance(1.0)  # t = 4: b
        self.assertEqual(self.successResultOf(b), PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.assertNoResult(again[0])
        self.clock.advance(2.0)  # t = 6: the new wait
        self.assertEqual(self.successResultOf(again[0]), PutStatus.FLUSH_SLAVE_TIMEOUT)

    def test_timeout_must_be_positive(self) -> None:
        """
        slaveTimeout 0 or less is refused, naming the key.
        """
        e = self.assertRaises(ValueError, GroupTransferService, self.clock, 0)
        self.assertIn("slaveTimeout", str(e))


class WaitOrderModelTests(SynchronousTestCase):
    """
    L{GroupTransferService} against a model of what it promises: a release
    answers every live wait the quorum offset covers, in offset order (of
    two waits for one offset, the earlier first); a timer call answers
    every live wait whose deadline has come, earlier waits first; a stop
    answers the rest in offset order.  The service keeps waits for an
    offset behind an earlier one's apart (a heap) from the common ones (a
    queue); the schedules below mix both.
    """

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(
        st.lists(
            st.one_of(
                # (Waits weighted: most steps add one, as puts do.)
                st.tuples(st.just("wait"), st.integers(0, 12)),
                st.tuples(st.just("wait"), st.integers(0, 12)),
                st.tuples(st.just("wait"), st.integers(0, 12)),
                st.tuples(st.just("quorum"), st.integers(0, 12)),
                st.tuples(st.just("release"), st.just(0)),
                st.tuples(st.just("advance"), st.integers(0, 8)),
                st.tuples(st.just("cancel"), st.integers(0, 20)),
                st.tuples(st.just("stop"), st.just(0)),
            ),
            min_size=8,
            max_size=60,
        )
    )
    # A wait behind an earlier one's offset; one for the same offset as a
    # queued wait, made after a later one (the earlier answered first);
    # deadlines of both kinds in one timer call.
    @example([("wait", 30), ("wait", 10), ("quorum", 10), ("release", 0)])
    @example([("wait", 5), ("wait", 9), ("wait", 5), ("quorum", 5), ("release", 0)])
    @example([("wait", 5), ("wait", 9), ("wait", 5), ("stop", 0)])
    @example([("wait", 9), ("advance", 1), ("wait", 5), ("wait", 9), ("advance", 6)])
    def test_matches_the_model(self, steps: list[tuple[str, int]]) -> None:
        """
        Every wait gets the model's answer, at the model's step, in the
        model's order.
        """
        clock = Clock()
        group = GroupTransferService(clock, timeout=3.0)
        fired: list[tuple[int, PutStatus]] = []
        # The model: live waits as [number, end offset, deadline].
        live: list[list[float]] = []
        expected: list[tuple[int, PutStatus]] = []
        deferreds: dict[int, Deferred[PutStatus]] = {}
        quorum, stopped, now = -1, False, 0.0
        for number, (step, value) in enumerate(steps):
            if step == "wait":
                d = group.wait_for(value)
                d.addCallback(lambda status, n=number: fired.append((n, status)))
                d.addErrback(lambda _: None)
                if stopped:
                    expected.append((number, PutStatus.SLAVE_NOT_AVAILABLE))
                elif value <= quorum:
                    expected.append((number, PutStatus.PUT_OK))
                else:
                    deferreds[number] = d
                    live.append([number, value, now + 3.0])
            elif step == "quorum":
                quorum = max(quorum, value)
                group.quorum_changed(quorum)
            elif step == "release":
                group.release()
                covered = sorted((w for w in live if w[1] <= quorum), key=lambda w: (w[1], w[0]))
                expected += [(int(w[0]), PutStatus.PUT_OK) for w in covered]
                live = [w for w in live if w[1] > quorum]
            elif step == "advance":
                # (Half-seconds: deadlines exact in binary floating point.)
                now += value / 2
                clock.advance(value / 2)
                due = [w for w in live if w[2] <= now]
                expected += [(int(w[0]), PutStatus.FLUSH_SLAVE_TIMEOUT) for w in due]
                live = [w for w in live if w[2] > now]
            elif step == "cancel":
                if live:
                    victim = live.pop(value % len(live))
                    deferreds[int(victim[0])].cancel()
            else:
                group.stop()
                stopped = True
                ordered = sorted(live, key=lambda w: (w[1], w[0]))
                expected += [(int(w[0]), PutStatus.SLAVE_NOT_AVAILABLE) for w in ordered]
                live = []
            self.assertEqual(fired, expected, f"after step {number} {step} {value}")
            self.assertEqual(group.waiting, len(live))
        group.stop()
        self.assertEqual(clock.getDelayedCalls(), [])


class WaitThenEquivalenceTests(SynchronousTestCase):
    """
    C{wait_then} and C{wait_for} answer alike, whatever the schedule.
    """

    @settings(deadline=None, derandomize=True, max_examples=80)
    @given(
        st.lists(
            st.one_of(
                st.tuples(st.just("wait"), st.integers(0, 50)),
                st.tuples(st.just("quorum"), st.integers(0, 50)),
                st.tuples(st.just("release"), st.just(0)),
                st.tuples(st.just("advance"), st.integers(0, 4)),
                st.tuples(st.just("stop"), st.just(0)),
            ),
            max_size=40,
        )
    )
    def test_same_answers(self, steps: list[tuple[str, int]]) -> None:
        """
        Two services driven by the same steps -- each wait made on one
        with C{wait_for}, on the other with C{wait_then} -- give every wait
        the same answer at the same step, in the same order, and the
        C{wait_then} answer is either returned or called, never both.
        """
        clocks = Clock(), Clock()
        deferreds = GroupTransferService(clocks[0], timeout=3.0)
        answers = GroupTransferService(clocks[1], timeout=3.0)
        # (Per step: which waits ended, as (wait number, status), in order.)
        fired: list[tuple[int, PutStatus]] = []
        called: list[tuple[int, PutStatus]] = []
        quorum = -1
        for number, (step, value) in enumerate(steps):
            if step == "wait":
                d = deferreds.wait_for(value)
                d.addCallback(lambda status, n=number: fired.append((n, status)))
                now = answers.wait_then(value, None, lambda status, n=number: called.append((n, status)))  # type: ignore[arg-type]
                if now is not None:
                    self.assertNotIn(number, [n for n, _ in called])
                    called.append((number, now))
            elif step == "quorum":
                quorum = max(quorum, value)
                deferreds.quorum_changed(quorum)
                answers.quorum_changed(quorum)
            elif step == "release":
                deferreds.release()
                answers.release()
            elif step == "advance":
                clocks[0].advance(value)
                clocks[1].advance(value)
            else:
                deferreds.stop()
                answers.stop()
            self.assertEqual(called, fired, f"after step {number} {step} {value}")
            self.assertEqual(deferreds.waiting, answers.waiting)
        deferreds.stop()
        answers.stop()
        self.assertEqual(called, fired)
        self.assertEqual(len({n for n, _ in called}), len(called))


class SyncMasterTests(SynchronousTestCase):
    """
    SYNC_MASTER puts, with slaves as connections on StringTransports.
    """

    def broker(
        self, role: Role = Role.SYNC_MASTER, segment_size: int = 64 * 1024, **options: object
    ) -> Broker:
        self.reactor = MemoryReactorClock()
        store = self.mktemp()
        settings, runtime = settings_and_runtime(
            options, role=role, ha_listen="tcp:0", slave_timeout=3.0
        )
        broker = Broker(
            settings,
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=segment_size, clock=fixed_clock),
            **runtime,
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        return broker

    def slave(self, broker: Broker, port: int, report: int = 0) -> MasterConnection:
        factory = broker.master_factory
        assert factory is not None
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        connection.makeConnection(StringTransport())
        connection.dataReceived(struct.pack(">q", report))
        return connection

    def ack(self, connection: MasterConnection, offset: int) -> None:
        connection.dataReceived(struct.pack(">q", offset))

    def put(self, broker: Broker, body: bytes = b"x" * 100):  # type: ignore[no-untyped-def]
        return broker.put(Message("SyncTopic", body))

    def test_async_master_ok_at_once(self) -> None:
        """
        ASYNC_MASTER: PUT_OK at once, with no slave at all.
        """
        broker = self.broker(Role.ASYNC_MASTER)
        self.assertEqual(self.successResultOf(self.put(broker)).status, PutStatus.PUT_OK)

    def test_async_master_role_read_per_put(self) -> None:
        """
        An ASYNC_MASTER's puts are PUT_OK at once, with a slave connected
        that acknowledges nothing, and counted; once the role is
        SYNC_MASTER (a role change keeps the master side), the next put
        waits for the slave: the put path reads the role on every put.
        """
        broker = self.broker(Role.ASYNC_MASTER)
        slave = self.slave(broker, 40001)
        for _ in range(2):
            self.assertEqual(self.successResultOf(self.put(broker)).status, PutStatus.PUT_OK)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.PUT_OK], 2)
        self.assertEqual(broker.put_path.puts, 2)
        side = broker.roles.service
        assert isinstance(side, MasterSide)
        side.ha.sync = True
        d = self.put(broker)
        self.assertNoResult(d)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.PUT_OK], 3)
        side.ha.sync = False
        self.assertEqual(self.successResultOf(self.put(broker)).status, PutStatus.PUT_OK)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.PUT_OK], 4)

    def test_fenced_master_refuses(self) -> None:
        """
        A master whose fence refuses (failover: not elected, lease not
        renewed) takes no put: SERVICE_NOT_AVAILABLE with the fence's
        reason, nothing stored, on an ASYNC_MASTER as on a SYNC_MASTER.
        """
        from rmqha.broker import NotMasterError
        from rmqha.ha.fence import Fence

        for role in (Role.ASYNC_MASTER, Role.SYNC_MASTER):
            broker = self.broker(role)
            side = broker.roles.service
            assert isinstance(side, MasterSide)
            fence = Fence("n1", self.reactor.seconds)
            side.fence = fence
            before = broker.commitlog.max_offset
            failure = self.failureResultOf(self.put_deferred(broker), NotMasterError)
            self.assertEqual(str(failure.value), "this node is not the elected master")
            fence.elected = True
            failure = self.failureResultOf(self.put_deferred(broker), NotMasterError)
            self.assertIn("lease is not renewed", str(failure.value))
            self.assertEqual(broker.commitlog.max_offset, before)
            self.assertEqual(
                broker.put_path.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE], 2
            )
            fence.valid_until = self.reactor.seconds() + 10
            self.successResultOf(self.put(broker))

    def test_no_slave(self) -> None:
        """
        SYNC_MASTER without a slave: SLAVE_NOT_AVAILABLE at once, and the
        message is stored anyway.
        """
        broker = self.broker()
        result = self.successResultOf(self.put(broker))
        self.assertEqual(result.status, PutStatus.SLAVE_NOT_AVAILABLE)
        self.assertEqual(broker.commitlog.max_offset, result.next_offset)

    def test_min_in_sync_fails_fast(self) -> None:
        """
        With minInSyncReplicas 2 and no slave: IN_SYNC_REPLICAS_NOT_ENOUGH
        before the put is stored (a retry makes no duplicate).
        """
        from rmqha.broker import NotStoredError

        broker = self.broker(min_in_sync_replicas=2, in_sync_replicas=2)
        before = broker.commitlog.max_offset
        failure = self.failureResultOf(self.put_deferred(broker), NotStoredError)
        self.assertIs(failure.value.status, PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        self.assertIn("minInSyncReplicas is 2", str(failure.value))
        self.assertEqual(broker.commitlog.max_offset, before)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH], 1)

    def put_deferred(self, broker: Broker) -> Deferred:
        from twisted.internet.defer import maybeDeferred

        return maybeDeferred(self.put, broker)

    def test_cut_link_stops_counting(self) -> None:
        """
        minInSyncReplicas is a floor for every PUT_OK: a slave whose link is
        cut without a reset (its connection stays open, no ack comes) counts
        as connected only until an ack has been owed for the link timeout
        (1 s).  Puts stored meanwhile time out (never PUT_OK); later puts
        are refused unstored; once the slave acks again, puts are PUT_OK.
        """
        from rmqha.broker import NotStoredError

        broker = self.broker(min_in_sync_replicas=2, in_sync_replicas=2)
        slave = self.slave(broker, 40001)
        d = self.put(broker)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        # The link is cut: puts wait, and none is acknowledged.
        waiting = [self.put(broker)]
        self.reactor.advance(0.6)
        waiting.append(self.put(broker))
        self.reactor.advance(0.5)
        # An ack has been owed for 1.1 s: the slave no longer counts.
        before = broker.commitlog.max_offset
        failure = self.failureResultOf(self.put_deferred(broker), NotStoredError)
        self.assertIs(failure.value.status, PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        self.assertIn("0 replica(s) deliver acks", str(failure.value))
        self.assertEqual(broker.commitlog.max_offset, before)
        self.reactor.advance(3.0)
        self.assertEqual(
            [self.successResultOf(w).status for w in waiting],
            [PutStatus.FLUSH_SLAVE_TIMEOUT] * 2,
        )
        # The link heals: the slave acks what it was sent, and counts again.
        self.ack(slave, broker.commitlog.max_offset)
        d = self.put(broker)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.PUT_OK], 2)

    def test_slow_link_that_acks_counts(self) -> None:
        """
        A slave far behind that keeps acknowledging (catching up) delivers
        acks: it counts as connected however long it takes.
        """
        broker = self.broker(min_in_sync_replicas=2, in_sync_replicas=2)
        slave = self.slave(broker, 40001)
        for _ in range(5):
            self.put(broker)
            self.reactor.advance(0.8)
            self.ack(slave, broker.commitlog.max_offset - 50)
        d = self.put(broker)
        self.assertNoResult(d)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_slave_too_far_behind(self) -> None:
        """
        A slave further behind than haSlaveFallbehindMax does not count:
        SLAVE_NOT_AVAILABLE.
        """
        broker = self.broker(slave_fallbehind_max=150)
        self.put(broker)
        self.put(broker)
        self.slave(broker, 40001, report=0)
        self.assertEqual(
            self.successResultOf(self.put(broker)).status, PutStatus.SLAVE_NOT_AVAILABLE
        )

    def test_ack_and_timeout(self) -> None:
        """
        With a connected slave the put waits: PUT_OK when the slave acks
        its end offset; FLUSH_SLAVE_TIMEOUT when it does not within
        slaveTimeout.  Both messages are stored.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        d = self.put(broker)
        self.assertNoResult(d)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        d = self.put(broker)
        self.reactor.advance(3.0)
        result = self.successResultOf(d)
        self.assertEqual(result.status, PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.assertEqual(broker.commitlog.max_offset, result.next_offset)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.PUT_OK], 1)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.FLUSH_SLAVE_TIMEOUT], 1)
        # Waited 0 s and 3 s: the histogram has both, in the right buckets.
        buckets = dict(broker.put_path.replication_wait.cumulative())
        self.assertEqual((buckets["0.0001"], buckets["2.5"], buckets["5.0"]), (1, 1, 2))
        self.assertEqual(broker.put_path.replication_wait.total, 3.0)

    def test_one_slave_does_not_ack_for_another(self) -> None:
        """
        inSyncReplicas 3 (two slaves): one slave's ack is not enough, and
        the same slave acking twice is still one; the second slave's ack
        completes the quorum.
        """
        broker = self.broker(in_sync_replicas=3)
        a = self.slave(broker, 40001)
        b = self.slave(broker, 40002)
        d = self.put(broker)
        end = broker.commitlog.max_offset
        self.ack(a, end)
        self.ack(a, end)
        self.reactor.advance(0)
        self.assertNoResult(d)
        self.ack(b, end)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_two_slaves_only_one_acks(self) -> None:
        """
        The default quorum (master + one slave) with two slaves: either
        slave's ack is enough.
        """
        broker = self.broker()
        self.slave(broker, 40001)
        b = self.slave(broker, 40002)
        d = self.put(broker)
        self.ack(b, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_slave_disconnects_while_waiting(self) -> None:
        """
        A slave that goes away while puts wait no longer counts: a waiting
        put completes only when another slave acks, or times out; once too
        few slaves are left, puts are SLAVE_NOT_AVAILABLE at once.
        """
        broker = self.broker(in_sync_replicas=3)
        a = self.slave(broker, 40001)
        b = self.slave(broker, 40002)
        d = self.put(broker)
        end = broker.commitlog.max_offset
        self.ack(a, end)
        b.connectionLost()
        c = self.slave(broker, 40003)
        self.reactor.advance(1)
        self.assertNoResult(d)
        self.ack(c, end)
        self.reactor.advance(0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        d = self.put(broker)
        a.connectionLost()
        self.reactor.advance(3)
        self.assertEqual(self.successResultOf(d).status, PutStatus.FLUSH_SLAVE_TIMEOUT)
        # Now one slave for a quorum that needs two: refused at once.
        self.assertEqual(
            self.successResultOf(self.put(broker)).status, PutStatus.SLAVE_NOT_AVAILABLE
        )

    def test_ack_fires_within_data_received(self) -> None:
        """
        The firing rule: the put a slave's ack covers has its result when
        the master's C{dataReceived} returns, with no reactor turn and no
        call scheduled for it; the puts its callback makes go to the slave
        before that C{dataReceived} returns: the first at once (the last
        put released: nothing to batch it with), the others stored
        together at the release's end, in one frame.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        transport = slave.transport
        assert isinstance(transport, StringTransport)
        d = self.put(broker)
        transport.clear()
        before = broker.commitlog.max_offset
        statuses: list = []
        more: list = []

        def done(result):  # type: ignore[no-untyped-def]
            statuses.append(result.status)
            more.extend(self.put(broker) for _ in range(3))

        d.addCallback(done)
        calls = len(self.reactor.getDelayedCalls())
        self.ack(slave, before)
        self.assertEqual(statuses, [PutStatus.PUT_OK])
        self.assertEqual(len(more), 3)
        self.assertEqual(len(self.reactor.getDelayedCalls()), calls)
        # Two frames (12-byte headers, classic framing): the first record
        # at once (the last put released: nothing to batch it with), then
        # the other two, stored together at the release's end.
        sent = frames(transport.value())
        record = (broker.commitlog.max_offset - before) // 3
        self.assertEqual(
            [(offset, len(data)) for offset, data in sent],
            [(before, record), (before + record, 2 * record)],
        )
        self.assertEqual(b"".join(data for _, data in sent), broker.commitlog.read(before, 3 * record))
        self.ack(slave, broker.commitlog.max_offset)
        self.assertEqual([self.successResultOf(m).status for m in more], [PutStatus.PUT_OK] * 3)

    def test_released_puts_sent_early_in_pieces(self) -> None:
        """
        Puts released by one ack that append more than EARLY_BYTES between
        them reach the slave in pieces while the release runs, not in one
        frame at its end (so that producers do not move in one convoy);
        the frames are consecutive and cover every byte.
        """
        broker = self.broker(segment_size=1 << 20)
        slave = self.slave(broker, 40001)
        transport = slave.transport
        assert isinstance(transport, StringTransport)
        body = b"b" * 1024
        waiting = [self.put(broker, body) for _ in range(32)]
        self.reactor.advance(0)
        transport.clear()
        before = broker.commitlog.max_offset
        sent_when_called: list[int] = []
        more: list = []

        def again(result):  # type: ignore[no-untyped-def]
            sent_when_called.append(len(transport.value()))
            more.append(self.put(broker, body))

        for d in waiting:
            d.addCallback(again)
        self.ack(slave, before)
        self.assertEqual(len(more), 32)
        end = broker.commitlog.max_offset
        sent = frames(transport.value())
        self.assertGreaterEqual(len(sent), 3)
        self.assertEqual(sent[0][0], before)
        self.assertEqual(b"".join(data for _, data in sent), broker.commitlog.read(before, end - before))
        for (offset, data), (following, _) in zip(sent, sent[1:]):
            self.assertEqual(offset + len(data), following)
        # The first frame, of at least EARLY_BYTES, left while callbacks
        # were still to run.
        self.assertGreaterEqual(len(sent[0][1]), EARLY_BYTES)
        self.assertGreater(sent_when_called[-1], 0)

    def test_released_puts_stored_together_at_the_end(self) -> None:
        """
        The puts the callbacks of one release make travel together
        (docs/sync.md, "Puts released together are stored together"):
        none is stored or sent while a later released put's callback is
        still to run; the last one's put is stored with all of them and
        sent in one frame before that put returns.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        transport = slave.transport
        assert isinstance(transport, StringTransport)
        waiting = [self.put(broker) for _ in range(3)]
        self.reactor.advance(0)
        transport.clear()
        before = broker.commitlog.max_offset
        seen: list[tuple[int, int]] = []
        more: list = []

        def again(result):  # type: ignore[no-untyped-def]
            more.append(self.put(broker, f"again {len(more)}".encode()))
            seen.append((broker.commitlog.max_offset, len(transport.value())))

        for d in waiting:
            d.addCallback(again)
        self.ack(slave, before)
        end = broker.commitlog.max_offset
        self.assertEqual(seen, [(before, 0), (before, 0), (end, len(transport.value()))])
        self.assertEqual(
            [(offset, len(data)) for offset, data in frames(transport.value())],
            [(before, end - before)],
        )
        self.ack(slave, end)
        results = [self.successResultOf(d) for d in more]
        self.assertEqual([r.status for r in results], [PutStatus.PUT_OK] * 3)
        self.assertEqual(results[0].offset, before)
        self.assertEqual([r.next_offset for r in results[:2]], [r.offset for r in results[1:]])
        self.assertEqual(results[-1].next_offset, end)
        bodies = [r.body for r in broker.commitlog.records(before)]  # type: ignore[union-attr]
        self.assertEqual(bodies, [b"again 0", b"again 1", b"again 2"])

    def test_busy_slave_gets_released_puts_at_the_end(self) -> None:
        """
        A slave with more than twice the released puts' bytes still to
        acknowledge gets them in one frame when the release is done.
        """
        broker = self.broker(segment_size=1 << 20)
        slave = self.slave(broker, 40001)
        transport = slave.transport
        assert isinstance(transport, StringTransport)
        body = b"b" * 1024
        waiting, ends = [], []
        for _ in range(96):
            waiting.append(self.put(broker, body))
            ends.append(broker.commitlog.max_offset)
        self.reactor.advance(0)
        transport.clear()
        start = broker.commitlog.max_offset
        more: list = []
        for d in waiting[:24]:
            d.addCallback(lambda _: more.append(self.put(broker, body)))
        # The first 24 acknowledged: 72 records stay unacknowledged.
        self.ack(slave, ends[23])
        self.assertEqual(len(more), 24)
        self.assertGreater(broker.commitlog.max_offset - start, EARLY_BYTES)
        self.assertEqual(
            [(offset, len(data)) for offset, data in frames(transport.value())],
            [(start, broker.commitlog.max_offset - start)],
        )

    def test_stop_while_waiting(self) -> None:
        """
        Stopping the broker resolves waiting puts with SLAVE_NOT_AVAILABLE.
        """
        broker = self.broker()
        self.slave(broker, 40001)
        d = self.put(broker)
        self.assertNoResult(d)
        broker.stopService()
        self.assertEqual(self.successResultOf(d).status, PutStatus.SLAVE_NOT_AVAILABLE)



class ReleasedPutsGroupTests(SynchronousTestCase):
    """
    Puts made while a release runs (from released puts' callbacks) are
    stored together when it ends (docs/sync.md, "Puts released together
    are stored together"): refusals stay immediate, order is the order
    made, a failure to store them answers each with the error, and
    nothing is lost or answered twice.
    """

    broker = SyncMasterTests.broker
    slave = SyncMasterTests.slave
    ack = SyncMasterTests.ack

    def released(self, broker: Broker, slave: MasterConnection, callback) -> object:  # type: ignore[no-untyped-def]
        """
        Put two messages and run C{callback} inside the release their ack
        makes, from the first's callback (the puts it makes are held: the
        second is still to fire); C{callback}'s return value.
        """
        d = broker.put(Message("SyncTopic", b"first"))
        broker.put(Message("SyncTopic", b"second"))
        out: list = []
        d.addCallback(lambda _: out.append(callback()))
        self.ack(slave, broker.commitlog.max_offset)
        self.assertEqual(len(out), 1)
        return out[0]

    def bodies(self, broker: Broker, start: int) -> list[bytes]:
        return [r.body for r in broker.commitlog.records(start)]  # type: ignore[union-attr]

    def test_refusals_stay_immediate(self) -> None:
        """
        A message that breaks a limit, or a put on a fenced master, is
        refused by the call itself, inside a release as outside; the puts
        made beside them are stored.
        """
        from rmqha.broker import NotMasterError
        from rmqha.ha.fence import OPEN, Fence
        from rmqha.store._record import MessageRejected

        broker = self.broker()
        slave = self.slave(broker, 40001)
        start = broker.commitlog.max_offset
        refused: list = []
        answers: list = []

        def inside() -> None:
            broker.put_then(Message("SyncTopic", b"kept"), answers.append)
            try:
                broker.put_then(Message("", b"no topic"), answers.append)
            except MessageRejected as e:
                refused.append(type(e))
            side = broker.roles.service
            assert isinstance(side, MasterSide)
            side.fence = Fence("n1", self.reactor.seconds)
            try:
                broker.put(Message("SyncTopic", b"fenced"))
            except NotMasterError as e:
                refused.append(type(e))
            side.fence = OPEN

        self.released(broker, slave, inside)
        self.assertEqual(refused, [MessageRejected, NotMasterError])
        self.assertEqual(self.bodies(broker, start), [b"first", b"second", b"kept"])
        self.ack(slave, broker.commitlog.max_offset)
        self.assertEqual([a.status for a in answers], [PutStatus.PUT_OK])

    def test_fence_closed_before_the_release_ends(self) -> None:
        """
        Puts held in a release are checked again when it ends: a lease
        lost meanwhile (the fence refusing) stores none of them, each
        answered with the refusal.
        """
        from rmqha.broker import NotMasterError
        from rmqha.ha.fence import Fence

        broker = self.broker()
        slave = self.slave(broker, 40001)
        start = broker.commitlog.max_offset
        answers: list = []

        def inside() -> None:
            broker.put_then(Message("SyncTopic", b"a"), answers.append)
            broker.put_then(Message("SyncTopic", b"b"), answers.append)
            side = broker.roles.service
            assert isinstance(side, MasterSide)
            side.fence = Fence("n1", self.reactor.seconds)

        self.released(broker, slave, inside)
        self.assertEqual([type(a) for a in answers], [NotMasterError, NotMasterError])
        self.assertEqual(self.bodies(broker, start), [b"first", b"second"])
        self.assertEqual(broker.put_path.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE], 2)

    def test_store_failure_answers_each_with_the_error(self) -> None:
        """
        When the puts held in a release cannot be stored at its end (the
        disk full), nothing of them is stored, C{put}'s Deferreds fail and
        C{put_then}'s answers get the L{NotStoredError}, each put counted,
        the failure logged once; the next puts are stored.
        """
        import errno

        from rmqha.broker import NotStoredError

        broker = self.broker()
        slave = self.slave(broker, 40001)
        log = broker.commitlog
        real = log.put_batch

        def full(messages):  # type: ignore[no-untyped-def]
            raise OSError(errno.ENOSPC, "No space left on device")

        answers: list = []

        def inside():  # type: ignore[no-untyped-def]
            self.patch(log, "put_batch", full)
            broker.put_then(Message("SyncTopic", b"a"), answers.append)
            return broker.put(Message("SyncTopic", b"b"))

        start = log.max_offset
        d = self.released(broker, slave, inside)
        self.assertEqual(self.bodies(broker, start), [b"first", b"second"])
        self.assertEqual(len(answers), 1)
        self.assertIsInstance(answers[0], NotStoredError)
        self.assertTrue(answers[0].disk_full)
        failure = self.failureResultOf(d, NotStoredError)  # type: ignore[arg-type]
        self.assertIs(failure.value.status, PutStatus.UNKNOWN_ERROR)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.UNKNOWN_ERROR], 2)
        self.patch(log, "put_batch", real)
        result = self.successResultOf(
            self.released(broker, slave, lambda: None) or succeed(None)  # (a release with no put)
        )
        self.assertIsNone(result)
        d = broker.put(Message("SyncTopic", b"c"))
        self.ack(slave, log.max_offset)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_held_puts_time_out_together(self) -> None:
        """
        Puts held and stored together wait once: with no ack they all time
        out after slaveTimeout as FLUSH_SLAVE_TIMEOUT, each counted, and
        the replication-wait histogram counts each put's wait.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        answers: list = []
        waits = broker.put_path.replication_wait
        before = sum(waits.counts)

        def inside() -> None:
            for body in (b"a", b"b", b"c"):
                broker.put_then(Message("SyncTopic", body), answers.append)

        self.released(broker, slave, inside)
        self.assertEqual(answers, [])
        self.reactor.advance(2.9)
        self.assertEqual(answers, [])
        self.reactor.advance(0.2)
        self.assertEqual([a.status for a in answers], [PutStatus.FLUSH_SLAVE_TIMEOUT] * 3)
        self.assertEqual(len({a.offset for a in answers}), 3)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.FLUSH_SLAVE_TIMEOUT], 3)
        # The two released puts and the three held ones.
        self.assertEqual(sum(waits.counts) - before, 5)
        self.assertAlmostEqual(waits.total, 3 * 3.1, delta=0.01)

    def test_cancelled_put_is_stored(self) -> None:
        """
        A put made in a release and cancelled before the release ends is
        still stored (cancelling withdraws the wait, never the message),
        with no error.
        """
        from twisted.internet.defer import CancelledError

        broker = self.broker()
        slave = self.slave(broker, 40001)
        start = broker.commitlog.max_offset

        def inside():  # type: ignore[no-untyped-def]
            d = broker.put(Message("SyncTopic", b"cancelled"))
            d.cancel()
            return d

        d = self.released(broker, slave, inside)
        self.failureResultOf(d, CancelledError)  # type: ignore[arg-type]
        self.assertEqual(self.bodies(broker, start), [b"first", b"second", b"cancelled"])
        self.ack(slave, broker.commitlog.max_offset)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_other_stores_come_after_the_held_puts(self) -> None:
        """
        A batch, or a record too large to hold, stored from a release goes
        after the puts held before it: the log is in the order the calls
        were made.
        """
        broker = self.broker(segment_size=1 << 20)
        slave = self.slave(broker, 40001)
        start = broker.commitlog.max_offset
        big = b"L" * (20 * 1024)

        def inside() -> None:
            broker.put_then(Message("SyncTopic", b"one"), lambda r: None)
            broker.put_batch([Message("SyncTopic", b"two"), Message("SyncTopic", b"three")])
            broker.put_then(Message("SyncTopic", b"four"), lambda r: None)
            broker.put(Message("SyncTopic", big))
            broker.put_then(Message("SyncTopic", b"five"), lambda r: None)

        self.released(broker, slave, inside)
        self.assertEqual(
            self.bodies(broker, start),
            [b"first", b"second", b"one", b"two", b"three", b"four", big, b"five"],
        )

    def test_answer_that_raises_is_logged(self) -> None:
        """
        An answer that raises is logged; the other puts stored with it are
        answered as if it had not.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        answers: list = []

        def boom(result):  # type: ignore[no-untyped-def]
            raise ZeroDivisionError("an answer's own bug")

        def inside() -> None:
            broker.put_then(Message("SyncTopic", b"a"), boom)
            broker.put_then(Message("SyncTopic", b"b"), answers.append)

        self.released(broker, slave, inside)
        self.ack(slave, broker.commitlog.max_offset)
        self.assertEqual([a.status for a in answers], [PutStatus.PUT_OK])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_slave_lost_inside_the_release(self) -> None:
        """
        The only slave's connection is lost while puts are held (a
        partition ending in a reset, from inside the release): the held
        puts are stored, and answered SLAVE_NOT_AVAILABLE when the release
        ends -- never PUT_OK, which no slave acknowledged.
        """
        from twisted.internet.error import ConnectionLost
        from twisted.python.failure import Failure

        broker = self.broker()
        slave = self.slave(broker, 40001)
        start = broker.commitlog.max_offset
        answers: list = []

        def inside() -> None:
            broker.put_then(Message("SyncTopic", b"a"), answers.append)
            broker.put_then(Message("SyncTopic", b"b"), answers.append)
            slave.connectionLost(Failure(ConnectionLost()))

        self.released(broker, slave, inside)
        self.assertEqual([a.status for a in answers], [PutStatus.SLAVE_NOT_AVAILABLE] * 2)
        records = list(broker.commitlog.records(start))
        self.assertEqual([r.body for r in records], [b"first", b"second", b"a", b"b"])  # type: ignore[union-attr]
        self.assertEqual([a.offset for a in answers], [r.physical_offset for r in records[2:]])  # type: ignore[union-attr]

    def test_stopped_inside_the_release(self) -> None:
        """
        A master stopped by a released put's callback stores none of the
        puts held in that release: each is answered with the error a put
        on the stopped master raises (its log is closed).
        """
        from rmqha.store.errors import StoreError

        broker = self.broker()
        slave = self.slave(broker, 40001)
        log = broker.commitlog
        answers: list = []

        def inside() -> int:
            broker.put_then(Message("SyncTopic", b"a"), answers.append)
            broker.stopService()
            return log.max_offset

        before = self.released(broker, slave, inside)
        self.assertEqual(len(answers), 1)
        self.assertIsInstance(answers[0], StoreError)
        self.assertIn("is closed", str(answers[0]))
        self.assertEqual(log.max_offset, before)

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.lists(st.sampled_from([10, 300, 1000, 5000, 13000]), max_size=12),
            min_size=1,
            max_size=6,
        ),
        st.lists(st.sampled_from(["all", "half", "none"]), min_size=6, max_size=6),
    )
    def test_every_put_answered_once_in_order(
        self, rounds: list[list[int]], acks: list[str]
    ) -> None:
        """
        Random releases whose callbacks make puts of random sizes (some
        larger than a group): every put is answered once, with its own
        offset, in the log in the order made, PUT_OK only once the slave
        acknowledged its end.
        """
        broker = self.broker(segment_size=1 << 20)
        slave = self.slave(broker, 40001)
        log = broker.commitlog
        made: list[bytes] = []
        answers: dict[int, list] = {}
        start = log.max_offset
        pending = [broker.put(Message("SyncTopic", b"seed"))]
        for n, sizes in enumerate(rounds):
            def inside(_, sizes=sizes):  # type: ignore[no-untyped-def]
                for size in sizes:
                    body = b"%d:" % len(made) + b"x" * size
                    number = len(made)
                    made.append(body)
                    answers[number] = got = []
                    broker.put_then(
                        Message("SyncTopic", body),
                        lambda r, got=got: got.append((r, slave.ack_offset)),
                    )
            pending[-1].addCallback(inside)
            end = log.max_offset
            how = acks[n]
            if how != "none":
                self.ack(slave, end if how == "all" else max(slave.ack_offset or 0, end - 100))
            self.reactor.advance(0)
            pending.append(broker.put(Message("SyncTopic", b"seed")))
        for _ in range(3):  # (what the last releases' callbacks stored)
            self.ack(slave, log.max_offset)
            self.reactor.advance(0)
        records = [r for r in log.records(start) if not r.body.startswith(b"seed")]  # type: ignore[union-attr]
        stored = [r.body for r in records]
        answered = [n for n, got in answers.items() if got]
        self.assertEqual(stored, made[: len(stored)])
        for n, got in answers.items():
            self.assertLessEqual(len(got), 1, n)
        for n in answered:
            result, acked = answers[n][0]
            record = records[n]
            self.assertEqual(result.offset, record.physical_offset)
            self.assertIs(result.status, PutStatus.PUT_OK)
            self.assertLessEqual(result.next_offset, acked)
        self.assertEqual(len(stored), len(made))
        self.assertEqual(len(answered), len(made))


class SyncFlushTests(SynchronousTestCase):
    """
    SYNC_FLUSH puts wait for the disk (group commit) as well as for the
    slaves; the disk's verdict comes first.
    """

    slave = SyncMasterTests.slave
    ack = SyncMasterTests.ack

    def broker(self, role: Role = Role.SYNC_MASTER) -> Broker:
        self.reactor = MemoryReactorClock()
        self.flushes: list = []
        store = self.mktemp()

        def held(f):  # type: ignore[no-untyped-def]
            d: Deferred = Deferred()
            self.flushes.append((f, d))
            return d

        broker = Broker(
            BrokerSettings(
                role=role,
                ha_listen="tcp:0",
                slave_timeout=3.0,
                sync_flush_timeout=5.0,
            ),
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(
                store, segment_size=64 * 1024, clock=fixed_clock,
                flush_disk_type=FlushDiskType.SYNC_FLUSH,
            ),
            run_in_thread=held,
        )
        broker.startService()
        self.addCleanup(self._release_and_stop, broker)
        return broker

    def _release_and_stop(self, broker: Broker) -> None:
        self.run_flushes()
        broker.stopService()
        self.run_flushes()

    def run_flushes(self) -> None:
        while self.flushes:
            f, d = self.flushes.pop(0)
            f()
            d.callback(None)

    def put(self, broker: Broker, body: bytes = b"x" * 100):  # type: ignore[no-untyped-def]
        return broker.put(Message("SyncTopic", body))

    def test_async_master_waits_for_disk(self) -> None:
        """
        ASYNC_MASTER with SYNC_FLUSH: PUT_OK once the flush that covers the
        put is done; FLUSH_DISK_TIMEOUT when none finishes within
        syncFlushTimeout (the message is stored).
        """
        broker = self.broker(Role.ASYNC_MASTER)
        d = self.put(broker)
        self.assertNoResult(d)
        self.run_flushes()
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        d = self.put(broker)
        self.reactor.advance(5.0)
        result = self.successResultOf(d)
        self.assertEqual(result.status, PutStatus.FLUSH_DISK_TIMEOUT)
        self.assertEqual(broker.commitlog.max_offset, result.next_offset)

    def test_both_ok(self) -> None:
        """
        SYNC_MASTER and SYNC_FLUSH: PUT_OK when both the disk and a slave
        hold the put, whichever comes last.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        d = self.put(broker)
        self.ack(slave, broker.commitlog.max_offset)
        self.reactor.advance(0)
        self.assertNoResult(d)
        self.run_flushes()
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)

    def test_failed_disk_wait(self) -> None:
        """
        A SYNC_FLUSH put whose wait for the disk fails (the store closed
        under it) fails with that error itself (not wrapped in a
        FirstError), once: nothing is logged as unhandled.
        """
        from twisted.internet.defer import fail

        broker = self.broker(Role.ASYNC_MASTER)
        self.patch(broker.store, "when_flushed", lambda offset: fail(OSError(5, "closed")))
        failure = self.failureResultOf(self.put(broker), OSError)
        self.assertEqual(failure.value.strerror, "closed")
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_disk_verdict_first(self) -> None:
        """
        Disk and slave both late: FLUSH_DISK_TIMEOUT (RocketMQ applies the
        flush status first); disk done, slave late: FLUSH_SLAVE_TIMEOUT.
        """
        broker = self.broker()
        slave = self.slave(broker, 40001)
        d = self.put(broker)
        self.reactor.advance(5.0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.FLUSH_DISK_TIMEOUT)
        self.run_flushes()
        # (Acked late, but acked: its link delivers acks, so it counts.)
        slave.dataReceived(struct.pack(">q", broker.commitlog.max_offset))
        d = self.put(broker)
        self.run_flushes()
        self.reactor.advance(3.0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.FLUSH_SLAVE_TIMEOUT)


class _PutThen:
    """
    Puts through L{Broker.put_then}, as a L{Deferred} for the tests' own
    assertions: fired with the result returned now, or with the one
    C{answer} is called with later.  Its contract is checked for every
    put: C{answer} is never called when the result came back now, and
    at most once; a breach fails the test at its end.
    """

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.breaches: list[str] = []
        self.addCleanup(lambda: self.assertEqual(self.breaches, []))  # type: ignore[attr-defined]

    def put(self, broker: Broker, body: bytes = b"x" * 100):  # type: ignore[no-untyped-def]
        d: Deferred = Deferred()
        breaches = self.breaches
        returned: list = []

        def answer(result):  # type: ignore[no-untyped-def]
            if returned:
                breaches.append(f"answered {result} after returning {returned[0]}")
            elif d.called:
                breaches.append(f"answered twice: {result}")
            else:
                d.callback(result)

        now = broker.put_then(Message("SyncTopic", body), answer)
        if now is not None:
            if d.called:
                breaches.append(f"answered before returning {now}")
            else:
                returned.append(now)
                d.callback(now)
        return d


class SyncMasterPutThenTests(_PutThen, SyncMasterTests):
    """
    L{SyncMasterTests} with every put through L{Broker.put_then}: the same
    statuses, at the same moments, with no L{Deferred} in the put path.
    """


class SyncFlushPutThenTests(_PutThen, SyncFlushTests):
    """
    L{SyncFlushTests} with every put through L{Broker.put_then}.
    """

    def test_failed_disk_wait(self) -> None:
        """
        A SYNC_FLUSH put whose wait for the disk fails (the store closed
        under it) is answered FLUSH_DISK_TIMEOUT -- stored, not known on
        disk -- and the failure is logged.
        """
        from twisted.internet.defer import fail

        broker = self.broker(Role.ASYNC_MASTER)
        self.patch(broker.store, "when_flushed", lambda offset: fail(OSError(5, "closed")))
        result = self.successResultOf(self.put(broker))
        self.assertEqual(result.status, PutStatus.FLUSH_DISK_TIMEOUT)
        self.assertEqual(broker.commitlog.max_offset, result.next_offset)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.FLUSH_DISK_TIMEOUT], 1)


class LiveCountMemoTests(SynchronousTestCase):
    """
    L{rmqha.ha.replicas.Replicas.live_count} answers from its last pass
    over the links while that answer holds: under any schedule of puts,
    acks, time, new slaves, dropped and lost connections and link-timeout
    changes, it answers what a fresh pass answers, and the puts end with
    the same statuses at the same moments.
    """

    def world(self, store: str, memo: bool) -> tuple[Broker, MemoryReactorClock]:
        reactor = MemoryReactorClock()
        settings, runtime = settings_and_runtime(
            # (Minutes pass: the store's thorough flush runs, in line.)
            {
                "min_in_sync_replicas": 2,
                "in_sync_replicas": 3,
                "run_in_thread": lambda f: succeed(f()),
            },
            role=Role.SYNC_MASTER,
            ha_listen="tcp:0",
            slave_timeout=3.0,
            slave_fallbehind_max=300,
        )
        broker = Broker(
            settings,
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=1 << 20, clock=fixed_clock),
            **runtime,
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        if not memo:
            # The reference: a fresh pass for every question.
            replicas = broker.master_factory.replicas  # type: ignore[union-attr]
            self.patch(
                replicas,
                "live_count",
                lambda past=-1: replicas._count_live(reactor.seconds(), past),
            )
        return broker, reactor

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.tuples(st.just("put"), st.integers(1, 3)),
                st.tuples(st.just("advance"), st.sampled_from([0, 0.2, 0.5, 0.999, 1.0, 1.3, 4.0])),
                st.tuples(st.just("ack"), st.integers(0, 3), st.sampled_from([0, 40, 200, 400])),
                st.tuples(st.just("connect"), st.integers(0, 1)),
                st.tuples(st.just("drop"), st.integers(0, 3)),
                st.tuples(st.just("lose"), st.integers(0, 3)),
                st.tuples(st.just("timeout"), st.sampled_from([0.5, 1.0, 2.0])),
            ),
            max_size=40,
        )
    )
    def test_memo_answers_as_a_fresh_pass(self, steps: list[tuple]) -> None:
        from twisted.internet.error import ConnectionDone
        from twisted.python.failure import Failure

        from rmqha.broker import NotStoredError

        root = self.mktemp()
        worlds = [self.world(f"{root}-{name}", memo) for name, memo in (("a", True), ("b", False))]
        slaves: list[list[MasterConnection]] = [[], []]
        lost: list[set[int]] = [set(), set()]
        outcomes: list[list[object]] = [[], []]
        for step in [("connect", 0), ("connect", 1), *steps]:
            for n, (broker, reactor) in enumerate(worlds):
                mine, log = slaves[n], broker.commitlog
                kind = step[0]
                if kind == "put":
                    for _ in range(step[1]):
                        try:
                            d = broker.put(Message("SyncTopic", b"x" * 100))
                        except NotStoredError as e:
                            outcomes[n].append(e.status)
                        else:
                            d.addCallback(lambda r, out=outcomes[n]: out.append(r.status))
                elif kind == "advance":
                    reactor.advance(step[1])
                elif kind == "ack" and step[1] < len(mine):
                    c = mine[step[1]]
                    if c.replicating and c.ack_offset is not None:
                        offset = max(c.ack_offset, log.max_offset - step[2])
                        c.dataReceived(struct.pack(">q", offset))
                        reactor.advance(0)
                elif kind == "connect" and len(mine) < 4:
                    factory = broker.master_factory
                    assert factory is not None
                    c = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000 + len(mine)))
                    c.makeConnection(StringTransport())
                    c.dataReceived(struct.pack(">q", log.max_offset if step[1] else 0))
                    mine.append(c)
                elif kind == "drop" and step[1] < len(mine):
                    mine[step[1]].drop("a test drops it")
                elif kind == "lose" and step[1] < len(mine) and step[1] not in lost[n]:
                    lost[n].add(step[1])
                    mine[step[1]].connectionLost(Failure(ConnectionDone()))
                elif kind == "timeout":
                    broker.master_factory.replicas.link_timeout = step[1]  # type: ignore[union-attr]
            answers = []
            for broker, _ in worlds:
                acks = broker.master_factory.replicas  # type: ignore[union-attr]
                end = broker.commitlog.max_offset
                answers.append([acks.live_count(past) for past in (-1, end - 300, end - 50, end)])
            self.assertEqual(answers[0], answers[1], step)
        self.assertEqual(outcomes[0], outcomes[1])

    def test_link_stops_counting_on_time(self) -> None:
        """
        A remembered count ends when the earliest link's owed ack reaches
        the link timeout, not later: the link counts at 1 s owed, not
        just after.
        """
        broker, reactor = self.world(self.mktemp(), True)
        factory = broker.master_factory
        assert factory is not None
        connections = []
        for port in (40001, 40002):
            c = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
            c.makeConnection(StringTransport())
            c.dataReceived(struct.pack(">q", 0))
            connections.append(c)
        broker.put(Message("SyncTopic", b"x" * 100))
        replicas = factory.replicas
        self.assertEqual(replicas.live_count(), 2)
        reactor.advance(0.5)
        connections[1].dataReceived(struct.pack(">q", broker.commitlog.max_offset))
        self.assertEqual(replicas.live_count(), 2)
        reactor.advance(0.5)
        self.assertEqual(replicas.live_count(), 2)
        reactor.advance(1e-3)
        self.assertEqual(replicas.live_count(), 1)
        # A drop counts at once, with no ack or time in between.
        connections[1].drop("a test drops it")
        self.assertEqual(replicas.live_count(), 0)


class FailoverFloorTests(SynchronousTestCase):
    """
    Failover mode: minInSyncReplicas is a floor for every PUT_OK, whatever
    the in-sync set is.
    """

    def setUp(self) -> None:
        from rmqha.ha.group import HAService
        from rmqha.ha.insync import InSyncSet

        self.clock = Clock()
        self.acks = StubAcks()
        self.ha = HAService(
            self.clock,
            acks=self.acks,
            appended=StubAppended(1000),
            sync=True,
            in_sync_replicas=2,
            min_in_sync_replicas=2,
            slave_fallbehind_max=1 << 20,
            slave_timeout=3.0,
        )
        self.in_sync = InSyncSet(
            self.clock,
            "m",
            lambda members: succeed(True),
            fallbehind_max=1 << 20,
            observers=(self.ha,),
        )
        self.ha.use_in_sync(self.in_sync)
        self.addCleanup(self.ha.stop)

    def test_master_alone_is_not_enough(self) -> None:
        """
        The in-sync set is the master alone and a replica is catching up
        (connected, delivering acks, not yet in the set): the put is stored
        (the replica may enter in time) but never PUT_OK on the master's
        copy alone; it times out unless the replica enters and acks it.
        """
        self.acks.live_node_ids = {"b"}
        self.assertIsNone(self.ha.refusal())
        d = self.ha.wait_for(1000)
        self.assertNoResult(d)
        self.clock.advance(3.0)
        self.assertEqual(self.successResultOf(d), PutStatus.FLUSH_SLAVE_TIMEOUT)
        # b catches up and enters: the next put waits for its ack.
        d = self.ha.wait_for(1000)
        self.acks.nodes["b"] = 1000
        self.in_sync.acked("b", 1000, 1000, 0)
        self.ha.release()
        self.assertEqual(self.successResultOf(d), PutStatus.PUT_OK)

    def test_wait_then_as_wait_for(self) -> None:
        """
        HAService.wait_then answers as wait_for fires, in failover mode:
        the floor of one and the lease good, PUT_OK now; the lease gone,
        SLAVE_NOT_AVAILABLE now; otherwise a wait the in-sync member's
        ack releases.
        """
        from rmqha.ha.fence import Fence

        answers: list = []
        self.acks.live_node_ids = {"b"}
        self.assertIsNone(self.ha.wait_then(1000, "put", answers.append))  # type: ignore[arg-type]
        self.acks.nodes["b"] = 1000
        self.in_sync.acked("b", 1000, 1000, 0)
        self.ha.release()
        self.assertEqual(answers, [PutMessageResult(PutStatus.PUT_OK, "put")])  # type: ignore[arg-type]
        self.ha._min_in_sync_replicas = 1
        self.in_sync.gone("b")
        self.assertEqual(
            self.ha.wait_then(2000, "alone", answers.append),  # type: ignore[arg-type]
            PutMessageResult(PutStatus.PUT_OK, "alone"),  # type: ignore[arg-type]
        )
        self.ha._fence = Fence("m", self.clock.seconds)
        self.assertEqual(
            self.ha.wait_then(3000, "fenced", answers.append),  # type: ignore[arg-type]
            PutMessageResult(PutStatus.SLAVE_NOT_AVAILABLE, "fenced"),  # type: ignore[arg-type]
        )
        self.assertEqual(len(answers), 1)

    def test_refused_without_anyone_to_wait_for(self) -> None:
        """
        The master alone and no other replica delivering acks: refused
        before storing, naming the floor.
        """
        self.acks.live_node_ids = set()
        refusal = self.ha.refusal()
        assert refusal is not None
        self.assertIn("minInSyncReplicas is 2", refusal)

    def test_one_is_enough_with_a_floor_of_one(self) -> None:
        """
        minInSyncReplicas 1: the master alone answers PUT_OK.
        """
        self.ha._min_in_sync_replicas = 1
        self.assertIsNone(self.ha.refusal())
        self.assertEqual(self.successResultOf(self.ha.wait_for(1000)), PutStatus.PUT_OK)


class VisibleEndTests(SynchronousTestCase):
    """
    Failover mode on a SYNC_MASTER: consumers read only what every
    in-sync member holds (L{HAService.visible_end}, the broker's consume
    queues dispatched up to it): a message read before then could be
    lost with the master, and another written at its place.
    """

    setUp = FailoverFloorTests.setUp

    def test_follows_the_quorum(self) -> None:
        """
        C{visible_end} is C{acked_end}, moving with the in-sync members'
        acks and telling C{on_acked_end} each time; without an in-sync
        set, or on an ASYNC master, C{None} (the whole log).
        """
        told: list[int] = []
        self.ha.on_acked_end = lambda: told.append(self.ha.acked_end)
        self.assertEqual(self.ha.visible_end(), 0)
        self.acks.live_node_ids = {"b"}
        d = self.ha.wait_for(1000)
        self.assertEqual(self.ha.visible_end(), 0)
        # b catches up and enters the set.
        self.acks.nodes["b"] = 1000
        self.in_sync.acked("b", 1000, 1000, 0)
        self.ha.release()
        self.assertEqual(self.successResultOf(d), PutStatus.PUT_OK)
        self.assertEqual((self.ha.visible_end(), told), (1000, [1000]))
        # The master appends up to 2000; b holds 1500 of it: 1500 visible.
        self.ha._appended.max_offset = 2000  # type: ignore[attr-defined]
        d = self.ha.wait_for(2000)
        self.acks.nodes["b"] = 1500
        self.ha.acks_changed()
        self.ha.release()
        self.assertNoResult(d)
        self.assertEqual((self.ha.visible_end(), told), (1500, [1000, 1500]))
        self.acks.nodes["b"] = 2000
        self.ha.acks_changed()
        self.ha.release()
        self.assertEqual(self.successResultOf(d), PutStatus.PUT_OK)
        self.assertEqual((self.ha.visible_end(), told), (2000, [1000, 1500, 2000]))
        self.ha.acks_changed()  # (nothing moved: nothing told)
        self.assertEqual(told, [1000, 1500, 2000])
        self.ha.sync = False
        self.assertIsNone(self.ha.visible_end())

    def test_alone_with_a_floor_of_one(self) -> None:
        """
        minInSyncReplicas 1, the master alone: each PUT_OK makes its put
        visible.
        """
        told: list[int] = []
        self.ha.on_acked_end = lambda: told.append(self.ha.acked_end)
        self.ha._min_in_sync_replicas = 1
        self.assertEqual(self.successResultOf(self.ha.wait_for(1000)), PutStatus.PUT_OK)
        self.assertEqual((self.ha.visible_end(), told), (1000, [1000]))

    def test_not_failover(self) -> None:
        """
        Without a coordinator (no in-sync set) the whole log is read, as
        RocketMQ 4.9.8 reads it.
        """
        from rmqha.ha.group import HAService

        ha = HAService(
            self.clock,
            acks=StubAcks(),
            appended=StubAppended(1000),
            sync=True,
            in_sync_replicas=2,
            min_in_sync_replicas=1,
            slave_fallbehind_max=1 << 20,
            slave_timeout=3.0,
        )
        self.assertIsNone(ha.visible_end())
