"""
Tests for how a slave finds out what its master is (docs/protocol.md):
the probe a RocketMQ master cannot see, the master's answer to it, what
the slave remembers in its store, C{--master-kind}, and what it logs.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha._wire import (
    CHECKED_HELLO,
    CONTROL_INFO_SIZE,
    CONTROL_PROBE,
    FEATURE_CHECKED_FRAMING,
    FEATURE_IDENTIFY,
    decode_control_info,
    encode_code,
    encode_control_info,
    encode_report,
)
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog
from rmqha.ha.control import CheckFailed, SilentMaster, probe
from rmqha.ha.divergence import MASTER_KIND_PATH, read_master_kind, write_master_kind
from rmqha.ha.master import MasterFactory
from rmqha.ha.slave import SlaveFactory, make_slave_service

from rmqha.testing import StringEndpoint
from tests._helpers import (
    fixed_clock,
    make_message,
    open_store,
    replica_of,
    replication_of,
    settings_and_runtime,
)

SEGMENT = 64 * 1024
#: A TLS alert record (fatal, protocol_version): what a TLS server sends
#: back for bytes that are no TLS hello.
TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x46"


class MasterAnswerTests(SynchronousTestCase):
    """
    An rmqha master's side of the probe.
    """

    def test_probe_answered_with_info(self) -> None:
        """
        A first value of exactly -1 (the probe; a RocketMQ slave's first
        report is its max offset, never negative) is answered at once with
        INFO, and the connection is not a slave's.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message(b"a"))
        factory = MasterFactory(log, Clock())
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.dataReceived(encode_code(CONTROL_PROBE)[:5])
        self.assertEqual(transport.value(), b"")
        connection.dataReceived(encode_code(CONTROL_PROBE)[5:])
        self.assertFalse(transport.disconnecting)
        info = decode_control_info(transport.value()[:CONTROL_INFO_SIZE])
        self.assertEqual(info, (0, log.max_offset, SEGMENT, FEATURE_CHECKED_FRAMING | FEATURE_IDENTIFY))
        self.assertEqual(factory.slaves(), [])
        connection.connectionLost()

    def test_classic_first_report_still_classic(self) -> None:
        """
        A classic slave's first report (0 or more) is still a report.
        """
        log = open_store(self, segment_size=SEGMENT)
        factory = MasterFactory(log, Clock())
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.dataReceived(encode_report(0))
        self.assertEqual(len(factory.slaves()), 1)
        connection.connectionLost()


class ProbeTimeoutTests(SynchronousTestCase):
    """
    L{probe}'s first timeout and its TLS hint.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.endpoint = StringEndpoint()

    def start(self, first_timeout: float | None) -> tuple[Deferred[Any], Any, StringTransport]:
        d = Deferred.fromCoroutine(
            probe(self.clock, self.endpoint, timeout=3.0, first_timeout=first_timeout)
        )
        client, transport = self.endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        return d, client, transport

    def test_silence_within_first_timeout_is_classic(self) -> None:
        """
        Nothing within the first timeout: classic, the probe connection
        closed, no timer left.
        """
        d, _, transport = self.start(0.5)
        self.clock.advance(0.4)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        self.assertIsNone(self.successResultOf(d))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_silence_kept_open_with_keep(self) -> None:
        """
        With C{keep}, silence within the first timeout gives a
        L{SilentMaster} whose connection stays open (a RocketMQ master is
        waiting on it), no timer left; handed over, the new protocol is
        connected to the same transport, writes on it, and gets its bytes
        and its end.
        """
        d = Deferred.fromCoroutine(
            probe(self.clock, self.endpoint, timeout=3.0, first_timeout=0.5, keep=True)
        )
        client, transport = self.endpoint.connected[-1]
        self.clock.advance(0.5)
        silent = self.successResultOf(d)
        assert isinstance(silent, SilentMaster)
        self.assertIs(silent.client, client)
        self.assertFalse(transport.disconnecting)
        self.assertTrue(client.reusable)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        successor = _Recorder()
        client.hand_over(successor)
        self.assertFalse(client.reusable)
        self.assertIs(successor.transport, transport)
        successor.transport.write(encode_report(0))
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE) + encode_report(0))
        client.dataReceived(b"frame")
        client.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(successor.received, [b"frame"])
        self.assertTrue(successor.lost)
        self.assertRaises(RuntimeError, client.hand_over, _Recorder())

    def test_late_bytes_spoil_the_kept_connection(self) -> None:
        """
        Bytes after the verdict, before the hand-over (a stalled rmqha
        master answering late): the connection is not reused but closed,
        and never handed over.
        """
        d = Deferred.fromCoroutine(
            probe(self.clock, self.endpoint, timeout=3.0, first_timeout=0.5, keep=True)
        )
        client, transport = self.endpoint.connected[-1]
        self.clock.advance(0.5)
        silent = self.successResultOf(d)
        assert isinstance(silent, SilentMaster)
        client.dataReceived(encode_control_info(0, 100, SEGMENT, 1))
        self.assertFalse(client.reusable)
        self.assertTrue(transport.disconnecting)
        self.assertRaises(RuntimeError, client.hand_over, _Recorder())

    def test_first_bytes_extend_to_timeout(self) -> None:
        """
        Part of an INFO within the first timeout: the master speaks the
        extension; the rest may take up to the whole timeout.
        """
        d, client, _ = self.start(0.5)
        info = encode_control_info(0, 100, SEGMENT, 1)
        client.dataReceived(info[:10])
        self.clock.advance(2.0)
        self.assertNoResult(d)
        client.dataReceived(info[10:])
        session = self.successResultOf(d)
        assert session is not None
        self.assertEqual(session[1].max_offset, 100)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_tls_answer_is_a_hint(self) -> None:
        """
        A TLS alert (a TLS master reading our plain bytes) fails the check
        with a hint to give --tls-ca; it is not taken for RocketMQ.
        """
        d, client, _ = self.start(0.5)
        client.dataReceived(TLS_ALERT)
        failure = self.failureResultOf(d, CheckFailed)
        self.assertIn("seems to speak TLS", failure.getErrorMessage())
        self.assertIn("--tls-ca", failure.getErrorMessage())


    def test_closed_unanswered_is_a_hint(self) -> None:
        """
        The probe closed without a byte (what a TLS server built on OpenSSL
        does with plain bytes): the check failed, with the --tls-ca hint.
        """
        d, client, _ = self.start(0.5)
        client.connectionLost(Failure(ConnectionDone()))
        failure = self.failureResultOf(d, CheckFailed)
        self.assertIn("closed the connection without answering", failure.getErrorMessage())
        self.assertIn("--tls-ca", failure.getErrorMessage())
        self.assertEqual(self.clock.getDelayedCalls(), [])


class _Recorder(Protocol):
    """
    A protocol that keeps what it receives.
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.lost = False

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = True


class MasterKindFileTests(SynchronousTestCase):
    """
    L{read_master_kind} and L{write_master_kind}.
    """

    def test_round_trip_and_other_master(self) -> None:
        """
        What is written is read back for that master only; a damaged file
        reads as unknown.
        """
        store = self.mktemp()
        os.makedirs(store)
        self.assertIsNone(read_master_kind(store, "m:1"))
        write_master_kind(store, "m:1", "rmqha", 12.0)
        self.assertEqual(read_master_kind(store, "m:1"), "rmqha")
        self.assertIsNone(read_master_kind(store, "other:1"))
        self.assertEqual(os.listdir(os.path.join(store, "rmqha")), ["master-kind.json"])
        with open(os.path.join(store, MASTER_KIND_PATH), "w") as f:
            f.write("{not json")
        self.assertIsNone(read_master_kind(store, "m:1"))

    def test_failed_write_leaves_no_tmp(self) -> None:
        """
        A write that fails leaves the old file and no tmp file behind.
        """
        store = self.mktemp()
        os.makedirs(store)
        write_master_kind(store, "m:1", "rmqha", 12.0)
        self.assertRaises(TypeError, write_master_kind, store, "m:1", object(), 13.0)  # type: ignore[arg-type]
        self.assertEqual(os.listdir(os.path.join(store, "rmqha")), ["master-kind.json"])
        self.assertEqual(read_master_kind(store, "m:1"), "rmqha")


class SlaveBrokerTests(SynchronousTestCase):
    """
    A slave broker's probe of its master, what it remembers, and what it
    does when the master does not answer.
    """

    def setUp(self) -> None:
        self.store = self.mktemp()
        self._lost: set[Any] = set()

    def broker(self, **kwargs: Any) -> tuple[Broker, MemoryReactorClock, StringEndpoint]:
        reactor = MemoryReactorClock()
        endpoint = kwargs.pop("endpoint", None) or StringEndpoint()
        # The master's address, as the store remembers it.
        endpoint.description = "127.0.0.1:10912"  # type: ignore[attr-defined]
        segment = kwargs.pop("segment", SEGMENT)
        settings, runtime = settings_and_runtime(kwargs, role=Role.SLAVE, master_endpoint=endpoint)
        broker = Broker(
            settings,
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(self.store, segment_size=segment, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            **runtime,
        )
        return broker, reactor, endpoint

    def stop(self, broker: Broker) -> None:
        d = broker.stopService()
        # StringTransports never report their connections lost: do it.
        endpoint = broker.roles.endpoint
        for protocol, transport in endpoint.connected:
            if transport.disconnecting and protocol not in self._lost:
                self._lost.add(protocol)
                protocol.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(d)

    def remembered(self) -> str | None:
        try:
            with open(os.path.join(self.store, MASTER_KIND_PATH)) as f:
                return str(json.load(f)["kind"])
        except FileNotFoundError:
            return None

    def test_seen_rmqha_never_downgrades(self) -> None:
        """
        A slave that once saw its master answer the probe remembers it in
        its store; after a restart, the same master silent past the probe
        timeout is not taken for RocketMQ: the check fails and is retried
        with a back-off, replication does not start classically, and the
        logs and C{problem} say why.
        """
        broker, reactor, endpoint = self.broker()
        broker.startService()
        client, _ = endpoint.connected[0]
        client.dataReceived(encode_control_info(0, 0, SEGMENT, FEATURE_CHECKED_FRAMING))
        assert broker.ha_service is not None
        self.assertTrue(broker.ha_service.running)
        self.assertEqual(replication_of(broker).master_kind, "rmqha")
        self.assertEqual(self.remembered(), "rmqha")
        self.stop(broker)

        broker, reactor, endpoint = self.broker()
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(self.stop, broker)
            reactor.advance(3.0)
        assert broker.ha_service is not None
        self.assertFalse(broker.ha_service.running)
        self.assertEqual(replication_of(broker).failed_checks, 1)
        self.assertEqual(len(endpoint.connected), 1)  # the probe only
        text = "\n".join(formatEvent(e) for e in events)
        self.assertIn(
            "master 127.0.0.1:10912 spoke the rmqha extension before but is not "
            "answering; not falling back to classic replication",
            text,
        )
        # 1 s plus up to 1 s of jitter, shown to a tenth: 1.0 to 2.0.
        self.assertRegex(text, r"; retrying in (1\.\d|2\.0) s")
        self.assertNotIn("replicating classically", text)
        assert broker.problem is not None
        self.assertIn("not falling back", broker.problem)
        # The retry (1 s and up to 1 s of jitter), answered: replication
        # starts, the problem is gone.
        reactor.advance(2.0)
        client, _ = endpoint.connected[-1]
        client.dataReceived(encode_control_info(0, 0, SEGMENT, FEATURE_CHECKED_FRAMING))
        self.assertTrue(broker.ha_service.running)
        self.assertIsNone(broker.problem)

    def test_silent_master_is_rocketmq_after_half_a_second(self) -> None:
        """
        A master never seen speaking the extension and silent for 0.5 s
        (not the whole 3 s probe timeout) is taken for RocketMQ, said once
        as a warning, and remembered; replication starts classically, on
        the probe's own connection.
        """
        broker, reactor, endpoint = self.broker()
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(self.stop, broker)
            reactor.advance(0.4)
            assert broker.ha_service is not None
            self.assertFalse(broker.ha_service.running)
            reactor.advance(0.1)
        self.assertTrue(broker.ha_service.running)
        self.assertEqual(self.remembered(), "rocketmq")
        self.assertFalse(replication_of(broker).checked)
        text = "\n".join(formatEvent(e) for e in events)
        self.assertEqual(text.count("replicating classically"), 1)
        self.assertEqual(len(endpoint.connected), 1)

    def test_probe_kept_as_the_replication_connection(self) -> None:
        """
        The probe a RocketMQ master did not answer is not closed (the
        master would log two ERROR lines): the slave's real report follows
        the -1 on the same connection -- a RocketMQ master takes the first
        non-negative report after its "none yet" -1 as the request
        offset -- and the master's frames on it are replicated.
        """
        log = CommitLog.open(self.store, segment_size=SEGMENT, clock=fixed_clock)
        log.put(make_message(b"first"))
        ours = log.max_offset
        log.close()
        broker, reactor, endpoint = self.broker()
        broker.startService()
        self.addCleanup(self.stop, broker)
        (probe_client, transport), = endpoint.connected
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        reactor.advance(0.5)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE) + encode_report(ours))
        self.assertEqual(len(endpoint.connected), 1)
        factory = replica_of(broker).slave_factory
        assert factory is not None
        self.assertEqual(factory.connections_made, 1)
        self.assertIsNone(factory.kept)
        # The master's frame on that connection is replicated and acked.
        master = CommitLog.open(self.mktemp(), segment_size=SEGMENT, clock=fixed_clock)
        self.addCleanup(master.close)
        master.put(make_message(b"first"))
        second = master.put(make_message(b"second"))
        body = master.read(ours, second.next_offset)
        transport.clear()
        probe_client.dataReceived(struct.pack(">qi", ours, len(body)) + body)
        assert broker.commitlog is not None
        self.assertEqual(broker.commitlog.max_offset, second.next_offset)
        self.assertEqual(transport.value(), encode_report(second.next_offset))
        # Its end is the replication connection's: reconnection follows.
        transport.loseConnection()
        self._lost.add(probe_client)
        probe_client.connectionLost(Failure(ConnectionDone()))
        self.assertIsNone(factory.connection)

    def test_remembered_rocketmq_master_probed_on_one_connection(self) -> None:
        """
        A master remembered as RocketMQ's is still probed (it may have been
        upgraded), on the connection replication then uses: no connection
        is ever given up on.
        """
        write_master_kind(self.store, "127.0.0.1:10912", "rocketmq", 12.0)
        broker, reactor, endpoint = self.broker()
        broker.startService()
        self.addCleanup(self.stop, broker)
        reactor.advance(0.5)
        (_, transport), = endpoint.connected
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE) + encode_report(0))
        self.assertFalse(transport.disconnecting)

    def lose(self, endpoint: StringEndpoint, index: int = -1) -> None:
        client, transport = endpoint.connected[index]
        transport.loseConnection()
        self._lost.add(client)
        client.connectionLost(Failure(ConnectionDone()))

    def test_reconnection_probes_in_place(self) -> None:
        """
        After the connection to a master taken for RocketMQ's ends, no
        separate probe connection is made (it would be given up on while
        replication reconnects): the next replication connection is its
        own probe -- -1 first, the real report once the master stayed
        silent for 0.5 s -- and nothing on it is closed.
        """
        broker, reactor, endpoint = self.broker()
        broker.startService()
        self.addCleanup(self.stop, broker)
        reactor.advance(0.5)
        self.lose(endpoint)
        self.assertEqual(len(endpoint.connected), 1)  # no check, no probe
        reactor.advance(1.0)  # the replication connection's retry
        self.assertEqual(len(endpoint.connected), 2)
        _, transport = endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        # The heartbeat timer (0.2 s here) sends no report meanwhile.
        reactor.advance(0.4)
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        reactor.advance(0.1)
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE) + encode_report(0))
        self.assertFalse(transport.disconnecting)
        self.assertEqual(len(endpoint.connected), 2)
        self.assertEqual(replication_of(broker).master_kind, "rocketmq")

    def test_in_place_probe_waits_the_first_timeout(self) -> None:
        """
        A connection's own probe waits as long as the check's first
        timeout: 0.5 s, or a shorter C{--probe-timeout}.
        """
        broker, reactor, endpoint = self.broker(probe_timeout=0.2)
        broker.startService()
        self.addCleanup(self.stop, broker)
        reactor.advance(0.2)
        self.assertEqual(replication_of(broker).master_kind, "rocketmq")
        self.lose(endpoint)
        reactor.advance(1.0)
        _, transport = endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        reactor.advance(0.2)
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE) + encode_report(0))

    def test_answered_replication_probe_checks_again(self) -> None:
        """
        A master taken for RocketMQ's (silent at the first probe, say a
        stalled rmqha master) that answers a replication connection's
        probe speaks the extension: that connection is closed, not read
        as frames; the master is checked again, remembered as rmqha, and
        the next replication connection asks for checked framing: it
        does not stay classic across reconnects.
        """
        broker, reactor, endpoint = self.broker()
        broker.startService()
        self.addCleanup(self.stop, broker)
        reactor.advance(0.5)
        self.assertEqual(replication_of(broker).master_kind, "rocketmq")
        self.lose(endpoint)
        reactor.advance(1.0)
        replication, transport = endpoint.connected[-1]
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))
        with capturedLogs() as events:
            replication.dataReceived(encode_control_info(0, 0, SEGMENT, FEATURE_CHECKED_FRAMING))
        self.assertTrue(transport.disconnecting or transport.disconnected)
        self.assertEqual(transport.value(), encode_code(CONTROL_PROBE))  # no report
        text = "\n".join(formatEvent(e) for e in events)
        self.assertIn("answered the rmqha probe on a replication connection: checking it again", text)
        self._lost.add(replication)
        replication.connectionLost(Failure(ConnectionDone()))
        probe_client, probe_transport = endpoint.connected[-1]
        self.assertIsNot(probe_client, replication)
        self.assertEqual(probe_transport.value(), encode_code(CONTROL_PROBE))
        probe_client.dataReceived(encode_control_info(0, 0, SEGMENT, FEATURE_CHECKED_FRAMING))
        self.assertEqual(replication_of(broker).master_kind, "rmqha")
        self.assertEqual(self.remembered(), "rmqha")
        reactor.advance(1.0)  # the replication connection's retry
        _, transport = endpoint.connected[-1]
        self.assertEqual(transport.value()[:8], encode_code(CHECKED_HELLO))

    def test_kept_probe_closed_on_stop(self) -> None:
        """
        A slave stopped between the verdict and replication closes the
        kept connection (a stopping slave's connection ends anyway).
        """
        broker, reactor, endpoint = self.broker()
        broker.startService()
        replica = replica_of(broker)
        factory = replica.slave_factory
        assert factory is not None
        client, transport = endpoint.connected[0]
        # (The verdict's moment, as the check hands the connection over.)
        factory.keep(client)
        self.stop(broker)
        self.assertIsNone(factory.kept)
        self.assertTrue(transport.disconnecting)

    def test_master_kind_rocketmq_skips_the_probe(self) -> None:
        """
        C{--master-kind rocketmq}: no probe connection at all; the first
        connection is the replication one, reporting at once.
        """
        broker, reactor, endpoint = self.broker(master_kind="rocketmq")
        broker.startService()
        self.addCleanup(self.stop, broker)
        assert broker.ha_service is not None
        self.assertTrue(broker.ha_service.running)
        self.assertEqual(len(endpoint.connected), 1)
        _, transport = endpoint.connected[0]
        self.assertEqual(transport.value(), encode_report(0))
        self.assertEqual(replication_of(broker).master_kind, "rocketmq")

    def test_master_kind_rmqha_never_classic(self) -> None:
        """
        C{--master-kind rmqha}: a silent master is a failed check, even one
        never seen before.
        """
        broker, reactor, endpoint = self.broker(master_kind="rmqha")
        broker.startService()
        self.addCleanup(self.stop, broker)
        reactor.advance(3.0)
        assert broker.ha_service is not None
        self.assertFalse(broker.ha_service.running)
        self.assertEqual(replication_of(broker).failed_checks, 1)
        assert broker.problem is not None
        self.assertIn("--master-kind rmqha", broker.problem)

    def test_segment_size_mismatch_halts(self) -> None:
        """
        A master whose INFO names another segment size: one line with both
        sizes, replication halted (not started, no retry), C{problem} set;
        not a blame on the master's data.
        """
        broker, reactor, endpoint = self.broker()
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(self.stop, broker)
            client, _ = endpoint.connected[0]
            client.dataReceived(encode_control_info(0, 0, 4 * SEGMENT, FEATURE_CHECKED_FRAMING))
            reactor.advance(60)
        assert broker.ha_service is not None
        self.assertFalse(broker.ha_service.running)
        self.assertEqual(len(endpoint.connected), 1)
        lines = [formatEvent(e) for e in events if "segments of" in formatEvent(e)]
        self.assertEqual(len(lines), 1)
        self.assertIn(f"segments of {4 * SEGMENT} bytes", lines[0])
        self.assertIn(f"this slave's store {SEGMENT}, as configured", lines[0])
        # (Empty, but its size was configured: the operator is told how.)
        self.assertIn("its store is empty: configure", lines[0])
        self.assertNotIn("corrupt", lines[0])
        assert broker.problem is not None
        self.assertIn("mappedFileSizeCommitLog", broker.problem)

    def test_empty_store_adopts_the_masters_segment_size(self) -> None:
        """
        An empty store whose segment size nobody configured takes the
        master's (said in one line) and replicates: the segment file the
        master's bytes go into has the master's size, and a restart keeps
        it (the files decide).
        """
        broker, reactor, endpoint = self.broker(segment=None)
        with capturedLogs() as events:
            broker.startService()
            client, _ = endpoint.connected[0]
            client.dataReceived(encode_control_info(0, 0, 4 * SEGMENT, FEATURE_CHECKED_FRAMING))
        assert broker.ha_service is not None
        self.assertTrue(broker.ha_service.running)
        self.assertIsNone(broker.problem)
        lines = [formatEvent(e) for e in events if "adopting" in formatEvent(e)]
        self.assertEqual(
            lines,
            [
                "store is empty: adopting master 127.0.0.1:10912's segment size "
                f"256 KiB ({4 * SEGMENT} bytes)"
            ],
        )
        commitlog = broker.commitlog
        assert commitlog is not None
        self.assertEqual(commitlog.segment_size, 4 * SEGMENT)
        master = CommitLog.open(self.mktemp(), segment_size=4 * SEGMENT, clock=fixed_clock)
        end = master.put(make_message()).next_offset
        commitlog.append_at(0, master.read(0, end))
        master.close()
        self.stop(broker)
        (name,) = os.listdir(os.path.join(self.store, "commitlog"))
        self.assertEqual(os.path.getsize(os.path.join(self.store, "commitlog", name)), 4 * SEGMENT)
        reopened = CommitLog.open(self.store, clock=fixed_clock)
        self.addCleanup(reopened.close)
        self.assertEqual((reopened.segment_size, reopened.max_offset), (4 * SEGMENT, end))

    def test_empty_segment_file_is_quarantined_not_deleted(self) -> None:
        """
        An empty store holding a segment file with no record in it (its
        own size, made before a crash) moves the file into quarantine, its
        bytes untouched, before it adopts the master's size.
        """
        commitlog_dir = os.path.join(self.store, "commitlog")
        os.makedirs(commitlog_dir)
        content = b"\0" * (SEGMENT - 1) + b"x"  # (no record; not all zeros either)
        with open(os.path.join(commitlog_dir, "0" * 20), "wb") as f:
            f.write(content)
        broker, reactor, endpoint = self.broker(segment=None)
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(self.stop, broker)
            client, _ = endpoint.connected[0]
            client.dataReceived(encode_control_info(0, 0, 4 * SEGMENT, FEATURE_CHECKED_FRAMING))
        assert broker.ha_service is not None and broker.commitlog is not None
        self.assertTrue(broker.ha_service.running)
        self.assertEqual(broker.commitlog.segment_size, 4 * SEGMENT)
        self.assertEqual(os.listdir(commitlog_dir), [])
        quarantine = os.path.join(self.store, "rmqha", "quarantine")
        (kept,) = [n for n in os.listdir(quarantine) if n.endswith(".segment")]
        with open(os.path.join(quarantine, kept), "rb") as f:
            self.assertEqual(f.read(), content)
        (line,) = [formatEvent(e) for e in events if "adopting" in formatEvent(e)]
        self.assertIn("its empty segment files are in quarantine: ", line)
        self.assertIn(kept, line)

    def test_store_with_records_still_halts(self) -> None:
        """
        A store holding a record keeps its segment size, configured or
        not: a master with another one halts replication, as before.
        """
        log = CommitLog.open(self.store, segment_size=SEGMENT, clock=fixed_clock)
        log.put(make_message())
        log.close()
        broker, reactor, endpoint = self.broker(segment=None)
        broker.startService()
        self.addCleanup(self.stop, broker)
        client, _ = endpoint.connected[0]
        client.dataReceived(encode_control_info(0, 0, 4 * SEGMENT, FEATURE_CHECKED_FRAMING))
        assert broker.ha_service is not None and broker.commitlog is not None
        self.assertFalse(broker.ha_service.running)
        self.assertEqual(broker.commitlog.segment_size, SEGMENT)
        assert broker.problem is not None
        self.assertIn(
            f"this slave's store {SEGMENT}: a slave's segment size must be its master's",
            broker.problem,
        )

    def test_unreachable_master_says_so(self) -> None:
        """
        A refused connection: "cannot reach master HOST:PORT: why;
        retrying in N s", not "divergence check failed".
        """
        broker, _, _ = self.broker(endpoint=StringEndpoint(refuse=True))
        with capturedLogs() as events:
            broker.startService()
            self.addCleanup(self.stop, broker)
        text = "\n".join(formatEvent(e) for e in events)
        self.assertIn("cannot reach master", text)
        self.assertIn("; retrying in", text)
        self.assertNotIn("divergence check failed", text)


class FollowingLogTests(SynchronousTestCase):
    """
    What a slave connection logs.
    """

    def connect(self, checked: bool = False) -> tuple[Any, StringTransport]:
        log = open_store(self, segment_size=SEGMENT)
        factory = SlaveFactory(log, Clock())
        factory.checked = checked
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 10912))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.7", 10912))
        connection.makeConnection(transport)
        self.addCleanup(connection.connectionLost)
        return connection, transport

    def test_following_once_per_connection(self) -> None:
        """
        The first report says which master is followed, from which offset
        and how; later reports say nothing.
        """
        with capturedLogs() as events:
            connection, _ = self.connect()
            connection.send_report()
            connection.send_report()
        lines = [formatEvent(e) for e in events if "following" in formatEvent(e)]
        self.assertEqual(lines, ["following master 10.0.0.7:10912 from offset 0 (classic)"])

    def test_tls_answer_dropped_with_hint(self) -> None:
        """
        A plain connection whose first bytes are a TLS record is dropped
        with a hint to give --tls-ca, not taken for frames.
        """
        with capturedLogs() as events:
            connection, transport = self.connect()
            connection.send_report()
            connection.dataReceived(TLS_ALERT)
        self.assertTrue(transport.disconnecting or transport.disconnected)
        text = "\n".join(formatEvent(e) for e in events)
        self.assertIn("seems to speak TLS", text)
        self.assertIn("--tls-ca", text)

    def test_replication_cannot_reach_master(self) -> None:
        """
        A replication connection attempt that fails is logged with the
        master, the reason and the delay before the next one, and kept for
        the broker's C{problem}.
        """
        log = open_store(self, segment_size=SEGMENT)
        clock = Clock()
        factory = SlaveFactory(log, clock)
        service = make_slave_service(
            StringEndpoint(refuse=True),  # type: ignore[arg-type]
            factory,
            clock,
            lambda attempt: 2.0,
            master="10.0.0.7:10912",
        )
        with capturedLogs() as events:
            service.startService()
        self.addCleanup(service.stopService)
        lines = [formatEvent(e) for e in events if "cannot reach" in formatEvent(e)]
        self.assertEqual(
            lines,
            [
                "cannot reach master 10.0.0.7:10912: Connection was refused by other "
                "side; retrying in 2.0 s"
            ],
        )
        self.assertEqual(factory.connect_failure, "Connection was refused by other side")
