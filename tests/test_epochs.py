"""
Tests for failover's epochs (docs/failover.md, "Epochs and rejoining"):
the epoch file (L{rmqha.ha.epochs.EpochFile}), L{rmqha.ha.epochs.common_end}
(RocketMQ 5's doTruncate), the EPOCHS control request on the wire, a
master recording its epoch, and a failover slave cutting its log back to
the newest epoch it shares with its master.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from hypothesis import given, settings, strategies as st
from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.ha._wire import (
    CONTROL_EPOCHS,
    CONTROL_HELLO,
    CONTROL_REQUEST_SIZE,
    FEATURE_EPOCHS,
    MAX_EPOCH_ENTRIES,
    ChecksumError,
    EpochsAnswer,
    ProtocolError,
    decode_control_request,
    decode_epochs_answer,
    encode_code,
    encode_control_info,
    encode_epochs_answer,
    encode_epochs_request,
)
from rmqha.ha.control import CheckFailed, ControlClient
from rmqha.ha.epochs import EPOCHS_PATH, EpochFile, EpochFileError, common_end, end_of
from rmqha.ha.master import MasterFactory
from rmqha.ha.replica import Replica, ReplicaState
from rmqha.store.commitlog import CommitLog
from rmqha.testing import StringEndpoint, connect_in_memory

from tests._helpers import fixed_clock, make_message, open_store, replication_of, settings_and_runtime
from tests.test_roles import _InMemory

SEGMENT = 64 * 1024
_PROPERTY = settings(deadline=None, derandomize=True, max_examples=200)


def _crc_line(entries: str) -> str:
    """
    The CRC line RocketMQ's checkpoint format puts over the entry lines.
    """
    return str(zlib.crc32(entries.encode()))


class EpochFileTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.store = self.mktemp()
        self.path = os.path.join(self.store, "rmqha", "epochs")

    def write(self, path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def test_a_store_without_one_is_empty(self) -> None:
        """
        A store that never had an epoch file has an empty list (a new
        replica), epoch 0, and nothing is written by reading.
        """
        epochs = EpochFile(self.store)
        self.assertEqual((epochs.entries, epochs.last_epoch), ([], 0))
        self.assertFalse(os.path.exists(os.path.dirname(self.path)))

    def test_format(self) -> None:
        """
        The file is RocketMQ's checkpoint text at <store>/rmqha/epochs: a
        count, the CRC-32 of the entry lines, then epoch-start lines; the
        previous list is in epochs.bak, no temporary file stays, and a
        new EpochFile reads the same list back.
        """
        epochs = EpochFile(self.store)
        epochs.append(7, 7000)
        epochs.append(8, 8000)
        self.assertEqual(EPOCHS_PATH, os.path.join("rmqha", "epochs"))
        both, first = "7-7000\n8-8000\n", "7-7000\n"
        with open(self.path) as f:
            self.assertEqual(f.read(), f"2\n{_crc_line(both)}\n{both}")
        with open(self.path + ".bak") as f:
            self.assertEqual(f.read(), f"1\n{_crc_line(first)}\n{first}")
        self.assertEqual(sorted(os.listdir(os.path.dirname(self.path))), ["epochs", "epochs.bak"])
        again = EpochFile(self.store)
        self.assertEqual(again.entries, [(7, 7000), (8, 8000)])
        self.assertEqual(again.last_epoch, 8)

    def test_append_rules(self) -> None:
        """
        Epochs and starts only grow: a lower epoch or start is refused in
        one line naming the file; the same entry again changes nothing; a
        newer epoch at the same start (a re-election with nothing written
        since: RocketMQ #9689) replaces the entry, which holds no bytes.
        """
        epochs = EpochFile(self.store)
        epochs.append(3, 100)
        epochs.append(3, 100)
        for epoch, start in [(2, 200), (3, 200), (4, 50)]:
            e = self.assertRaises(EpochFileError, epochs.append, epoch, start)
            self.assertIn(self.path, str(e))
            self.assertNotIn("\n", str(e))
        epochs.append(4, 100)
        self.assertEqual(epochs.entries, [(4, 100)])
        epochs.append(5, 300)
        self.assertEqual(EpochFile(self.store).entries, [(4, 100), (5, 300)])

    def test_full_file_drops_the_oldest(self) -> None:
        """
        Past MAX_EPOCH_ENTRIES elections that wrote to the log, the file
        holds the newest MAX_EPOCH_ENTRIES entries (a bounded ring: the
        oldest go) and survives a reload; before, the 4,097th such
        election could never be recorded, so its winner never took office.
        """
        from rmqha.ha.epochs import MAX_EPOCH_ENTRIES

        store = self.mktemp()
        epochs = EpochFile(store)
        epochs.replace([(e, e * 10) for e in range(1, MAX_EPOCH_ENTRIES + 1)])
        last = MAX_EPOCH_ENTRIES + 20
        for e in range(MAX_EPOCH_ENTRIES + 1, last + 1):
            epochs.append(e, e * 10)
        entries = EpochFile(store).entries
        self.assertEqual(len(entries), MAX_EPOCH_ENTRIES)
        self.assertEqual(entries[-1], (last, last * 10))
        self.assertEqual(entries[0], (21, 210))
        # A re-election with nothing written still replaces the last one.
        epochs.append(last + 1, last * 10)
        self.assertEqual(EpochFile(store).entries[-1], (last + 1, last * 10))
        self.assertEqual(len(EpochFile(store).entries), MAX_EPOCH_ENTRIES)

    def test_truncate_replace_end_of(self) -> None:
        """
        truncate_to drops the epochs starting past the offset; replace
        takes a valid list and refuses one whose epochs or starts do not
        grow; end_of is the next start, or the log's end, whichever is
        first (a slave may name an epoch it holds no bytes of yet).
        """
        epochs = EpochFile(self.store)
        epochs.replace([(1, 0), (3, 5000), (4, 7000)])
        self.assertEqual(epochs.end_of(3, 9000), 7000)
        self.assertEqual(epochs.end_of(4, 9000), 9000)
        self.assertEqual(epochs.end_of(3, 6000), 6000)
        self.assertIsNone(epochs.end_of(2, 9000))
        epochs.truncate_to(7000)
        self.assertEqual(epochs.entries, [(1, 0), (3, 5000), (4, 7000)])
        epochs.truncate_to(6999)
        self.assertEqual(EpochFile(self.store).entries, [(1, 0), (3, 5000)])
        self.assertRaises(EpochFileError, epochs.replace, [(1, 0), (1, 10)])
        self.assertRaises(EpochFileError, epochs.replace, [(1, 10), (2, 10)])
        self.assertRaises(EpochFileError, epochs.replace, [(0, 0)])
        self.assertEqual(epochs.entries, [(1, 0), (3, 5000)])

    def test_torn_temporary_file_is_ignored(self) -> None:
        """
        A crash while writing leaves the temporary file half written: it
        is never read.
        """
        EpochFile(self.store).append(2, 10)
        self.write(self.path + ".tmp", "3\n12")
        self.assertEqual(EpochFile(self.store).entries, [(2, 10)])

    def test_damaged_file_falls_back_to_backup(self) -> None:
        """
        A damaged file (torn, a CRC that does not match, a bad count,
        empty) is never taken for an empty list: the previous list in
        epochs.bak is used.
        """
        epochs = EpochFile(self.store)
        epochs.append(1, 0)
        epochs.append(2, 500)
        with open(self.path) as f:
            good = f.read()
        for damaged in [good[:-3], good.replace("2-500", "2-501"), "3" + good[1:], ""]:
            self.write(self.path, damaged)
            self.assertEqual(EpochFile(self.store).entries, [(1, 0)], damaged)
        os.unlink(self.path)
        self.assertEqual(EpochFile(self.store).entries, [(1, 0)])

    def test_both_damaged_raise(self) -> None:
        """
        When the file and its backup are both damaged, or the file is and
        there is no backup, opening fails with one line naming the file.
        """
        self.write(self.path, "1\n0\n1-0")
        e = self.assertRaises(EpochFileError, EpochFile, self.store)
        self.assertIn(self.path, str(e))
        self.assertIn("no backup", str(e))
        self.write(self.path + ".bak", "garbage\n")
        e = self.assertRaises(EpochFileError, EpochFile, self.store)
        self.assertIn(self.path, str(e))
        self.assertNotIn("\n", str(e))


def _runs(labels: list[int]) -> list[tuple[int, int]]:
    """
    The epoch list of a log whose byte i was written in epoch labels[i].
    """
    return [(e, i) for i, e in enumerate(labels) if i == 0 or labels[i - 1] != e]


class CommonEndTests(SynchronousTestCase):
    def test_rocketmq_example(self) -> None:
        """
        failover-anchors A.5: A (the old master) holds [(1,0),(3,5000)] up
        to 9000, B (the new one) [(1,0),(3,5000),(4,7000)] up to 12000:
        the newest common epoch is 3 and A is cut at min(9000, 7000).
        """
        self.assertEqual(common_end([(1, 0), (3, 5000)], 9000, [(1, 0), (3, 5000), (4, 7000)], 12000), 7000)
        # And B rejoining A (were A the master): B keeps 9000 at most.
        self.assertEqual(common_end([(1, 0), (3, 5000), (4, 7000)], 12000, [(1, 0), (3, 5000)], 9000), 7000)

    def test_kip_279_double_failover(self) -> None:
        """
        KIP-279: A wrote m1 m2 in epoch 0 (here 1), B had only m1; B led
        epoch 2 and wrote m3 at offset 1, then A led epoch 3 from offset 2.
        B rejoining A must keep only m1: epoch 1 is common, and B's own
        end of it (1) is the cut, not A's (2).
        """
        a = [(1, 0), (3, 2)]
        b = [(1, 0), (2, 1)]
        self.assertEqual(common_end(b, 2, a, 3), 1)

    def test_same_epoch_other_start_is_not_common(self) -> None:
        """
        An epoch both lists name but from different starts is not taken as
        common (it cannot be one master's); no common epoch at all is None.
        """
        self.assertEqual(common_end([(1, 0), (2, 50)], 90, [(1, 0), (2, 60)], 90), 50)
        self.assertIsNone(common_end([(2, 0)], 90, [(1, 0)], 90))
        self.assertIsNone(common_end([], 0, [(1, 0)], 90))

    @_PROPERTY
    @given(
        st.lists(st.integers(1, 50), min_size=1, max_size=6, unique=True).map(sorted),
        st.data(),
    )
    def test_identical_histories(self, epochs: list[int], data: Any) -> None:
        """
        Two nodes with the same list agree up to the shorter log's end.
        """
        starts = sorted(data.draw(st.lists(st.integers(0, 10_000), min_size=len(epochs), max_size=len(epochs), unique=True)))
        entries = list(zip(epochs, starts))
        ends = data.draw(st.tuples(st.integers(starts[-1], 20_000), st.integers(starts[-1], 20_000)))
        self.assertEqual(common_end(entries, ends[0], entries, ends[1]), min(ends))

    @_PROPERTY
    @given(
        st.lists(st.tuples(st.integers(1, 5), st.integers(1, 100)), min_size=1, max_size=8),
        st.data(),
    )
    def test_prefix(self, runs: list[tuple[int, int]], data: Any) -> None:
        """
        When one list is a prefix of the other, the cut is at most both
        ends: nothing past either log is ever claimed as common.
        """
        entries, epoch, start = [], 0, 0
        for step, length in runs:
            epoch += step
            entries.append((epoch, start))
            start += length
        master_end = start
        n = data.draw(st.integers(1, len(entries)))
        local = entries[:n]
        local_end = data.draw(st.integers(local[-1][1], master_end + 100))
        cut = common_end(local, local_end, entries, master_end)
        assert cut is not None
        self.assertLessEqual(cut, min(local_end, master_end))
        self.assertEqual(cut, min(local_end, end_of(entries, local[-1][0], master_end) or 0))

    @_PROPERTY
    @given(
        common=st.lists(st.integers(1, 4), max_size=4),
        a_more=st.integers(0, 3),
        b_more=st.integers(0, 3),
        a_runs=st.lists(st.integers(1, 4), max_size=3),
        b_runs=st.lists(st.integers(1, 4), max_size=3),
        a_idle=st.booleans(),
        b_idle=st.booleans(),
    )
    def test_cut_is_where_the_logs_part(
        self,
        common: list[int],
        a_more: int,
        b_more: int,
        a_runs: list[int],
        b_runs: list[int],
        a_idle: bool,
        b_idle: bool,
    ) -> None:
        """
        A model of two logs, byte by byte labelled with the epoch whose
        master wrote it (one master per epoch, so one label at one offset
        is one byte): a shared history, the last shared epoch continued by
        each for a while, then each side's own epochs (disjoint), and
        maybe an election with nothing written since.  The cut is exactly
        where the labels first differ (both directions); no shared
        history: None.
        """
        shared: list[int] = []
        for epoch, length in enumerate(common, start=1):
            shared += [epoch] * length
        last = len(common)

        def branch(more: int, runs: list[int], first: int, idle: bool) -> list[tuple[int, int]]:
            labels = shared + [last] * (more if last else 0)
            epoch = first
            for length in runs:
                labels += [epoch] * length
                epoch += 2
            entries = _runs(labels)
            if idle:
                entries.append((epoch, len(labels)))
            return entries, len(labels), labels  # type: ignore[return-value]

        a_entries, a_end, a_labels = branch(a_more, a_runs, last + 1, a_idle)  # type: ignore[misc]
        b_entries, b_end, b_labels = branch(b_more, b_runs, last + 2, b_idle)  # type: ignore[misc]
        # (An idle epoch at the same start as the last run replaces it.)
        for entries in (a_entries, b_entries):
            if len(entries) > 1 and entries[-1][1] == entries[-2][1]:
                del entries[-2]
        parted = 0
        while parted < min(a_end, b_end) and a_labels[parted] == b_labels[parted]:
            parted += 1
        expected = parted if last else None
        self.assertEqual(common_end(a_entries, a_end, b_entries, b_end), expected)
        self.assertEqual(common_end(b_entries, b_end, a_entries, a_end), expected)


class EpochsWireTests(SynchronousTestCase):
    def test_round_trip_any_chunking(self) -> None:
        """
        An EPOCHS answer decodes to what was encoded, only once whole
        (fed a byte at a time: None until then); the request has DIGEST's
        28-byte layout with its own code.
        """
        entries = [(1, 0), (3, 5000), (4, 7000)]
        data = encode_epochs_answer(4, 12000, entries)
        self.assertEqual(len(data), 36 + 16 * 3)
        for n in range(len(data)):
            self.assertIsNone(decode_epochs_answer(data[:n]))
        self.assertEqual(decode_epochs_answer(data + b"x"), (EpochsAnswer(4, 12000, entries), len(data)))
        request = encode_epochs_request()
        self.assertEqual(len(request), CONTROL_REQUEST_SIZE)
        self.assertEqual(decode_control_request(request), (CONTROL_EPOCHS, 0, 0))
        self.assertEqual(CONTROL_EPOCHS, -0x524D514841_0008)

    def test_hostile_answers(self) -> None:
        """
        A count past the limit is refused as soon as the head is here
        (before the entries are waited for); a damaged head or entry fails
        its CRC, every single bit (never a wait for more, never another
        valid answer); lists whose epochs or starts do not grow, or that end after
        the current epoch or max offset, are impossible: each one line.
        """
        def head(count: int) -> bytes:
            message = encode_code(CONTROL_EPOCHS) + bytes(16) + count.to_bytes(4, "big", signed=True)
            return message + zlib.crc32(message).to_bytes(4, "big")

        e = self.assertRaises(ProtocolError, decode_epochs_answer, head(MAX_EPOCH_ENTRIES + 1))
        self.assertIn("limit", str(e))
        self.assertRaises(ProtocolError, decode_epochs_answer, head(-1))
        data = encode_epochs_answer(4, 12000, [(1, 0), (4, 7000)])
        for bit in range(64, len(data) * 8):
            flipped = bytearray(data)
            flipped[bit // 8] ^= 0x80 >> (bit % 8)
            self.assertRaises(ChecksumError, decode_epochs_answer, flipped)
        for epoch, end, entries in [
            (4, 9000, [(2, 0), (2, 10)]),
            (4, 9000, [(1, 10), (2, 10)]),
            (3, 9000, [(1, 0), (4, 10)]),
            (4, 5, [(1, 0), (4, 10)]),
            (4, 9000, [(0, 0)]),
        ]:
            e = self.assertRaises(
                ProtocolError, decode_epochs_answer, encode_epochs_answer(epoch, end, entries)
            )
            self.assertNotIn("\n", str(e))
        wrong = encode_code(CONTROL_HELLO) + bytes(24)
        self.assertRaises(ProtocolError, decode_epochs_answer, wrong)
        self.assertRaises(ValueError, encode_epochs_answer, 1, 0, [(1, 0)] * (MAX_EPOCH_ENTRIES + 1))


class EpochsControlTests(SynchronousTestCase):
    """
    EPOCHS in a control session, in memory.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.log = open_store(self, segment_size=SEGMENT)
        for _ in range(20):
            self.log.put(make_message(b"e" * 200))

    def session(self, epochs: EpochFile | None) -> tuple[ControlClient, Any]:
        factory = MasterFactory(self.log, self.clock)
        factory.epochs = epochs
        connection = connect_in_memory(factory, Factory.forProtocol(ControlClient), self.clock)
        connection.flush()
        return connection.slave, connection

    def test_master_with_epochs(self) -> None:
        """
        A master with an epoch file offers FEATURE_EPOCHS in INFO and
        answers EPOCHS with its current epoch, max offset and list, in
        order with DIGEST answers.
        """
        epochs = EpochFile(self.mktemp())
        epochs.replace([(1, 0), (2, 1000)])
        client, connection = self.session(epochs)
        info = self.successResultOf(client.info)
        self.assertTrue(info.epochs)
        digest = client.digest(0, 100)
        answer = client.epochs()
        connection.flush()
        self.assertIsNotNone(self.successResultOf(digest))
        self.assertEqual(
            self.successResultOf(answer), EpochsAnswer(2, self.log.max_offset, [(1, 0), (2, 1000)])
        )

    def test_master_without_epochs(self) -> None:
        """
        A master without an epoch file does not offer FEATURE_EPOCHS, and
        a peer asking EPOCHS anyway is dropped.
        """
        client, connection = self.session(None)
        info = self.successResultOf(client.info)
        self.assertFalse(info.epochs)
        self.assertFalse(info.features & FEATURE_EPOCHS)
        answer = client.epochs()
        connection.flush()
        self.failureResultOf(answer, CheckFailed)

    def test_hostile_master(self) -> None:
        """
        A master answering EPOCHS with an impossible list, or sending
        bytes nobody asked for, ends the session: the waiter fails with
        CheckFailed (never a list), the connection is closed.
        """
        client = ControlClient(self.clock)
        transport = StringTransport()
        client.makeConnection(transport)
        client.dataReceived(encode_control_info(0, 100, SEGMENT, FEATURE_EPOCHS))
        answer = client.epochs()
        client.dataReceived(encode_epochs_answer(1, 100, [(2, 0)]))
        self.failureResultOf(answer, CheckFailed)
        self.assertTrue(transport.disconnecting)
        other = ControlClient(self.clock)
        other_transport = StringTransport()
        other.makeConnection(other_transport)
        other.dataReceived(encode_control_info(0, 100, SEGMENT, FEATURE_EPOCHS) + b"x" * 8)
        self.assertTrue(other_transport.disconnecting)


class _HeldThreads:
    """
    A broker's C{run_in_thread} whose calls, while C{hold} is set, wait in
    C{held} until L{release} runs them in order (the reactor meanwhile
    free: a cut that runs in the thread pool).
    """

    def __init__(self) -> None:
        self.hold = False
        self.held: list[tuple[Any, Deferred[Any]]] = []

    def __call__(self, f: Any) -> Deferred[Any]:
        if not self.hold:
            return succeed(f())
        d: Deferred[Any] = Deferred()
        self.held.append((f, d))
        return d

    def release(self, settle: Any) -> None:
        """Stop holding; run what was held, C{settle} after each."""
        self.hold = False
        while self.held:
            f, d = self.held.pop(0)
            d.callback(f())
            settle()
        settle()


class FailoverRejoinTests(_InMemory):
    """
    Brokers with epoch files (failover mode), in memory, on one clock.
    """

    def failover_broker(
        self, role: Role, master: Broker | None = None, store: str | None = None, **kw: Any
    ) -> Broker:
        store = store or self.mktemp()
        run_in_thread = kw.pop("run_in_thread", lambda f: succeed(f()))
        settings, runtime = settings_and_runtime(
            kw,
            # (A coordinated slave's settings hold its role once elected.)
            role=Role.MASTER if kw.get("coordinated") else role,
            ha_listen="tcp:0",
            master_endpoint=self.endpoint(master) if master else None,
            scrub_rate=0,
        )
        broker = Broker(
            settings,
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            run_in_thread=run_in_thread,
            retry_policy=lambda attempt: 1.0,
            fd_limit=lambda: 4096,
            epochs=EpochFile(store),
            **runtime,
        )
        broker.startService()
        return broker

    def puts(self, broker: Broker, n: int) -> int:
        end = 0
        for _ in range(n):
            end = self.put(broker).next_offset
        return end

    def replica(self, broker: Broker) -> Replica:
        side = broker.role_service
        assert isinstance(side, Replica)
        return side

    def partitioned(self, a: Broker) -> tuple[Broker, int, int]:
        """
        failover-anchors A.5's history: C{a} leads epoch 1; its slave B is
        elected in epoch 2 while C{a}, cut off, still takes puts; B takes
        more.  B, where the logs part, and where C{a}'s log ends.
        """
        self.switch(a.become_master(epoch=1))
        shared = self.puts(a, 5)
        b = self.failover_broker(Role.SLAVE, master=a)
        self.settle()
        self.switch(b.become_master(epoch=2))
        partition_era = self.puts(a, 4)
        self.puts(b, 2)
        return b, shared, partition_era

    def test_become_master_records_the_epoch(self) -> None:
        """
        become_master(epoch=N) flushes the log to its max offset and adds
        (N, max offset) to the epoch file, also on a broker that is a
        master already (a re-election); without an epoch file an epoch is
        refused; epoch None changes nothing.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        assert a.role_services.epochs is not None
        self.assertEqual(a.role_services.epochs.entries, [(1, 0)])
        end = self.puts(a, 3)
        self.switch(a.become_master(Role.SYNC_MASTER, epoch=2))
        self.assertEqual(a.role_services.epochs.entries, [(1, 0), (2, end)])
        self.assertGreaterEqual(a.commitlog.flushed_offset, end)
        self.switch(a.become_master())
        self.assertEqual(a.role_services.epochs.last_epoch, 2)
        plain = self.broker(Role.MASTER)
        self.assertRaises(ValueError, plain.become_master, epoch=1)
        self.stop(a, plain)

    def test_promoted_slave_records_before_serving(self) -> None:
        """
        A slave promoted with an epoch serves its slaves only once the
        epoch is on disk; when the epoch file cannot be written, it does
        not become a master at all.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        self.puts(a, 2)
        b = self.failover_broker(Role.SLAVE, master=a)
        self.settle()
        assert b.role_services.epochs is not None
        self.assertEqual(b.role_services.epochs.entries, [(1, 0)])  # adopted

        def full(epoch: int, start: int) -> None:
            raise OSError(28, "No space left on device")

        b.role_services.epochs.append = full  # type: ignore[method-assign]
        d = b.become_master(epoch=2)
        self.settle()
        self.failureResultOf(d, OSError)
        self.assertIsNone(b.master_factory)
        del b.role_services.epochs.append  # type: ignore[method-assign]
        self.switch(b.become_master(epoch=2))
        self.assertEqual(b.role_services.epochs.entries, [(1, 0), (2, b.commitlog.max_offset)])
        factory = b.master_factory
        assert factory is not None
        self.assertIs(factory.epochs, b.role_services.epochs)
        self.stop(a, b)

    def test_old_master_rejoins(self) -> None:
        """
        failover-anchors A.5 end to end: A leads epoch 1; B, its slave,
        is elected in epoch 2 while A, cut off, still takes puts; B takes
        more.  A rejoining as B's slave is cut back to where epoch 2
        starts: its partition-era bytes go to quarantine (counted in
        /status and /metrics), what both share stays, its epoch list
        becomes B's, and it replicates until both logs are identical.
        Without epochs the digest check would halt it (on-divergence
        halt).
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        shared = self.puts(a, 5)
        b = self.failover_broker(Role.SLAVE, master=a)
        self.settle()
        self.assertEqual(b.commitlog.max_offset, shared)
        self.switch(b.become_master(epoch=2))
        partition_era = self.puts(a, 4)
        b_end = self.puts(b, 6)
        self.assertGreater(partition_era, shared)

        self.switch(a.become_slave(self.endpoint(b)))  # type: ignore[arg-type]
        self.settle()
        replica = self.replica(a)
        self.assertIs(replica.state, ReplicaState.REPLICATING, a.problem)
        self.assertEqual((replication_of(a).epoch_truncations, replication_of(a).epoch_truncated_bytes), (1, partition_era - shared))
        quarantine = os.path.join(a.commitlog.store_dir, "rmqha", "quarantine")
        self.assertEqual(len([n for n in os.listdir(quarantine) if n.endswith(".bin")]), 1)
        assert a.role_services.epochs is not None and b.role_services.epochs is not None
        self.assertEqual(a.role_services.epochs.entries, [(1, 0), (2, shared)])
        self.assertEqual(a.role_services.epochs.entries, b.role_services.epochs.entries)
        self.assertEqual(a.commitlog.max_offset, b_end)
        self.assertEqual(a.commitlog.read(0, b_end), b.commitlog.read(0, b_end))
        self.assertEqual(dict(replication_of(a).divergences), {"ahead": 0, "behind": 0, "different": 0})

        from rmqha.admin import status

        self.assertEqual(status(a)["epoch_truncated_bytes"], partition_era - shared)
        self.stop(a, b)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cut_runs_in_a_thread(self) -> None:
        """
        The cut back (its quarantine copy with fsync, then zeroing: up to
        --max-cut bytes) runs in the thread pool, not on the reactor, whose
        timers -- a coordinator's lease renewals -- go on meanwhile (issue
        26, item 5); replication resumes once it is done.
        """
        threads = _HeldThreads()
        a = self.failover_broker(Role.MASTER, run_in_thread=threads)
        b, shared, partition_era = self.partitioned(a)
        threads.hold = True
        a.become_slave(self.endpoint(b), ("b", 2))  # type: ignore[arg-type]
        self.settle()
        self.assertIs(self.replica(a).state, ReplicaState.REPAIRING)
        self.assertEqual(a.commitlog.max_offset, partition_era)  # (not cut yet)
        ticks: list[float] = []
        self.clock.callLater(0.5, lambda: ticks.append(self.clock.seconds()))
        self.clock.advance(1.0)  # (the reactor is free: its timers run)
        self.assertEqual(len(ticks), 1)
        self.assertTrue(threads.held)
        threads.release(self.settle)
        self.assertIs(self.replica(a).state, ReplicaState.REPLICATING, a.problem)
        self.assertEqual(replication_of(a).epoch_truncated_bytes, partition_era - shared)
        self.assertEqual(a.commitlog.max_offset, b.commitlog.max_offset)
        self.stop(a, b)

    def test_reads_refused_until_the_log_is_checked(self) -> None:
        """
        A failover node serves consumers' reads only as the master or as a
        slave whose log passed the checks against its master
        (L{RoleMachine.read_refusal}): a deposed master rejoining holds its
        partition-era tail until the cut, and a consumer reading it then
        would read messages the failover loses (issue 30's phantom reads).
        Standing by, changing, and a slave still checking or repairing are
        refused, each named.
        """
        threads = _HeldThreads()
        a = self.failover_broker(Role.MASTER, run_in_thread=threads)
        b, shared, partition_era = self.partitioned(a)
        self.assertIsNone(a.roles.read_refusal())  # (the master it was)
        self.assertIsNone(b.roles.read_refusal())
        threads.hold = True
        a.become_slave(self.endpoint(b), ("b", 2))  # type: ignore[arg-type]
        self.settle()
        self.assertIs(self.replica(a).state, ReplicaState.REPAIRING)
        self.assertIn("not yet passed the checks", a.roles.read_refusal() or "")
        threads.release(self.settle)
        self.assertIs(self.replica(a).state, ReplicaState.REPLICATING, a.problem)
        self.assertIsNone(a.roles.read_refusal())
        self.switch(a.stand_by())
        self.assertIn("standing by", a.roles.read_refusal() or "")
        self.stop(a, b)

    def test_shared_epochs_verify_a_short_tail(self) -> None:
        """
        Once the epochs decided where two logs part, the digest check
        only confirms the last MiB (a slave following a new master does
        not hash 64 MiB before replicating); a store without epochs still
        gets the whole tail window.
        """
        from rmqha.ha import mastercheck
        from rmqha.ha.divergence import TAIL_WINDOW

        windows: list[int] = []
        real = mastercheck.find_divergence

        async def spy(*args: Any, window: int = TAIL_WINDOW, **kw: Any) -> Any:
            windows.append(window)
            return await real(*args, window=window, **kw)

        self.patch(mastercheck, "find_divergence", spy)
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        self.puts(a, 3)
        b = self.failover_broker(Role.SLAVE, master=a)  # (a new store: no epochs yet)
        self.settle()
        self.puts(a, 2)
        self.settle()
        self.switch(b.become_slave(self.endpoint(a)))  # type: ignore[arg-type]
        self.settle()
        self.assertEqual(windows, [TAIL_WINDOW, mastercheck.EPOCH_VERIFY_WINDOW])
        self.assertEqual(b.commitlog.max_offset, a.commitlog.max_offset)
        self.stop(a, b)

    def test_deposed_master_is_refused(self) -> None:
        """
        A node that has seen epoch 2 does not follow a master still at
        epoch 1: it backs off with a one-line problem naming both epochs,
        its log and epoch list untouched, and keeps refusing on retry.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        self.puts(a, 2)
        b = self.failover_broker(Role.SLAVE, master=a)
        self.settle()
        self.switch(b.become_master(epoch=2))
        b_end = self.puts(b, 2)
        self.switch(b.become_slave(self.endpoint(a)))  # type: ignore[arg-type]
        self.settle()
        replica = self.replica(b)
        self.assertIs(replica.state, ReplicaState.BACKING_OFF)
        problem = b.problem or ""
        self.assertIn("epoch 1, this node has seen epoch 2", problem)
        self.assertNotIn("\n", problem)
        self.clock.advance(1.0)
        self.settle()
        self.assertIs(replica.state, ReplicaState.BACKING_OFF)
        assert b.role_services.epochs is not None
        self.assertEqual(b.role_services.epochs.last_epoch, 2)
        self.assertEqual(b.commitlog.max_offset, b_end)
        self.stop(a, b)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def _store(self, bodies: list[bytes], entries: list[tuple[int, int]] | None = None) -> tuple[str, list[int]]:
        """
        A store holding C{bodies} (a message each) and, given C{entries} as
        (epoch, index of the body it starts at), that epoch list.
        """
        store = self.mktemp()
        log = CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock)
        starts = [log.put(make_message(body)).offset for body in bodies]
        starts.append(log.max_offset)
        log.close()
        for epoch, index in entries or []:
            EpochFile(store).append(epoch, starts[index])
        return store, starts

    def _untouched(self, broker: Broker, end: int, entries: list[tuple[int, int]]) -> None:
        self.assertEqual(broker.commitlog.max_offset, end)
        assert broker.role_services.epochs is not None
        self.assertEqual(broker.role_services.epochs.entries, entries)
        self.assertEqual(replication_of(broker).epoch_truncations, 0)
        quarantine = os.path.join(broker.commitlog.store_dir, "rmqha", "quarantine")
        self.assertFalse(os.path.exists(quarantine) and os.listdir(quarantine))

    def test_master_at_another_epoch_than_elected_is_not_followed(self) -> None:
        """
        A slave follows only the master the coordinator elected: a peer
        answering EPOCHS with another epoch than the leader's (a squatter's
        absurd 2^62, or a stale master) is refused, with both epochs named,
        and nothing is cut; the elected epoch is followed.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=3))
        end = self.puts(a, 2)
        b = self.failover_broker(Role.SLAVE, coordinated=True)
        self.switch(b.become_slave(self.endpoint(a), ("a", 1 << 62)))  # type: ignore[arg-type]
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.BACKING_OFF)
        self.assertIn(f"elected a at epoch {1 << 62}", b.problem or "")
        self.assertIn("says it is at epoch 3", b.problem or "")
        self.assertEqual(b.commitlog.max_offset, 0)
        self.switch(b.become_slave(self.endpoint(a), ("a", 3)))  # type: ignore[arg-type]
        self.settle()
        self.assertEqual(b.commitlog.max_offset, end)
        self.stop(a, b)

    def test_cut_of_the_whole_log_is_refused(self) -> None:
        """
        EPOCHS saying "cut everything" (a master in epoch 1 holding nothing
        of it, as a squatter answering [(1, 0)] would) is never acted on
        alone: nothing common to prove it by digest, so nothing is cut;
        the problem says what an operator can do.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=1))
        store, starts = self._store([b"acknowledged once"] * 3, [(1, 0)])
        b = self.failover_broker(Role.SLAVE, master=a, store=store)
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.BACKING_OFF)
        self.assertIn("would cut this node's whole log", b.problem or "")
        self.assertIn("empty one", b.problem or "")
        self._untouched(b, starts[-1], [(1, 0)])
        self.stop(a, b)

    def test_cut_the_master_cannot_prove_is_refused(self) -> None:
        """
        The epochs put the cut at an offset before which the master's
        bytes differ from this log's: the master's digest of the last MiB
        before the cut does not prove the common range, so nothing is cut.
        """
        a_store, a_starts = self._store([b"A" * 300, b"A" * 300], [(1, 0)])
        a = self.failover_broker(Role.MASTER, store=a_store)
        self.switch(a.become_master(epoch=4))
        b_store, b_starts = self._store([b"B" * 300, b"B" * 300, b"B" * 50], [(1, 0), (3, 2)])
        self.assertEqual(a_starts[2], b_starts[2])
        b = self.failover_broker(Role.SLAVE, master=a, store=b_store)
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.BACKING_OFF)
        self.assertIn("differ from this log's", b.problem or "")
        self._untouched(b, b_starts[-1], [(1, 0), (3, b_starts[2])])
        self.stop(a, b)

    def test_cut_beyond_max_cut_halts(self) -> None:
        """
        The old master rejoining (A.5) with more partition-era bytes than
        --max-cut: halted, naming the option and the size that allows it;
        nothing cut.  Restarted with that --max-cut, it is cut and rejoins.
        """
        a = self.failover_broker(Role.MASTER)
        b, shared, partition_era = self.partitioned(a)
        size = partition_era - shared
        a.role_services.max_cut = size - 1
        self.switch(a.become_slave(self.endpoint(b), ("b", 2)))  # type: ignore[arg-type]
        self.settle()
        self.assertIs(self.replica(a).state, ReplicaState.HALTED)
        self.assertIn(f"restart this node with --max-cut {size}", a.problem or "")
        self._untouched(a, partition_era, [(1, 0)])
        a.role_services.max_cut = size
        self.switch(a.become_slave(self.endpoint(b), ("b", 2)))  # type: ignore[arg-type]
        self.settle()
        self.assertEqual((replication_of(a).epoch_truncations, replication_of(a).epoch_truncated_bytes), (1, size))
        self.assertEqual(a.commitlog.max_offset, b.commitlog.max_offset)
        self.stop(a, b)

    def test_master_without_epochs_is_refused(self) -> None:
        """
        A failover slave does not follow a master that keeps no epochs:
        it backs off, saying so, and replicates nothing.
        """
        a = self.broker(Role.MASTER)
        self.puts(a, 2)
        b = self.failover_broker(Role.SLAVE, master=a)
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.BACKING_OFF)
        self.assertIn("keeps no epochs", b.problem or "")
        self.assertEqual(b.commitlog.max_offset, 0)
        self.stop(a, b)

    def test_no_common_epoch_halts(self) -> None:
        """
        A slave whose log shares no epoch with its master's halts (an
        operator decides), naming both lists' last entries; nothing cut.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=7))
        self.puts(a, 2)
        store = self.mktemp()
        log = CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock)
        end = log.put(make_message(b"other history")).next_offset
        log.close()
        EpochFile(store).append(5, 0)
        b = self.failover_broker(Role.SLAVE, master=a, store=store)
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.HALTED)
        self.assertIn("epoch 5 from 0", b.problem or "")
        self.assertIn("epoch 7 from 0", b.problem or "")
        self.assertEqual(b.commitlog.max_offset, end)
        self.stop(a, b)

    def test_pre_failover_store(self) -> None:
        """
        A slave store from before failover (data, no epoch file): the
        digest check decides.  A consistent prefix replicates and adopts
        the master's list; a diverged one halts (on-divergence halt) and
        adopts nothing.
        """
        a = self.failover_broker(Role.MASTER)
        first = self.puts(a, 1)
        self.puts(a, 3)
        self.switch(a.become_master(epoch=1))
        end = self.puts(a, 2)
        for same in (True, False):
            store = self.mktemp()
            log = CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock)
            if same:
                log.append_at(0, a.commitlog.read(0, first))
            else:
                log.put(make_message(b"x" * 300))
            log.close()
            b = self.failover_broker(Role.SLAVE, master=a, store=store)
            self.settle()
            assert b.role_services.epochs is not None
            if same:
                self.assertIs(self.replica(b).state, ReplicaState.REPLICATING)
                self.assertEqual(b.role_services.epochs.entries, a.role_services.epochs.entries)  # type: ignore[union-attr]
                self.assertEqual(b.commitlog.max_offset, end)
            else:
                self.assertIs(self.replica(b).state, ReplicaState.HALTED)
                self.assertEqual(b.role_services.epochs.entries, [])
            self.assertEqual(replication_of(b).epoch_truncations, 0)
            self.stop(b)
        self.stop(a)

    def test_rebootstrap_starts_a_new_epoch_file(self) -> None:
        """
        A store whose bytes differ from its master's within a shared
        epoch (the epoch cut finds nothing; the digest check does),
        rebootstrapped (on-divergence rebootstrap), goes aside with its
        epoch file; the new store adopts the master's list and writes it,
        though the list in memory was already the same.
        """
        a = self.failover_broker(Role.MASTER)
        self.switch(a.become_master(epoch=3))
        end = self.puts(a, 2)
        store = self.mktemp()
        log = CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock)
        log.put(make_message(b"x" * 300))
        log.close()
        EpochFile(store).append(3, 0)
        b = self.failover_broker(Role.SLAVE, master=a, store=store, on_divergence="rebootstrap")
        self.settle()
        self.assertIs(self.replica(b).state, ReplicaState.REPLICATING, b.problem)
        self.assertEqual(b.commitlog.max_offset, end)
        self.assertEqual(EpochFile(store).entries, [(3, 0)])
        self.stop(a, b)


class SilentMasterTests(SynchronousTestCase):
    def test_rocketmq_master_is_not_followed(self) -> None:
        """
        A failover slave never replicates classically: a master silent to
        the probe (a genuine RocketMQ master) is refused with a one-line
        problem, and replication never starts; a broker asked for both
        epochs and --master-kind rocketmq refuses at once.
        """
        reactor = MemoryReactorClock()
        endpoint = StringEndpoint()
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.SLAVE, master_endpoint=endpoint),  # type: ignore[arg-type]
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            epochs=EpochFile(store),
        )
        broker.startService()
        reactor.advance(0.5)
        assert broker.ha_service is not None
        self.assertFalse(broker.ha_service.running)
        self.assertIn("follows only a master that keeps epochs", broker.problem or "")
        self.assertIs(broker.role_service.state, ReplicaState.BACKING_OFF)  # type: ignore[union-attr]
        reactor.advance(5)
        self.assertFalse(broker.ha_service.running)
        d = broker.stopService()
        for protocol, transport in endpoint.connected:
            if transport.disconnecting:
                protocol.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(d)
        self.assertRaises(
            ValueError,
            Broker,
            BrokerSettings(
                role=Role.SLAVE,
                master_endpoint="tcp:host=127.0.0.1:port=1",
                master_kind="rocketmq",
            ),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT),
            epochs=EpochFile(store),
        )
