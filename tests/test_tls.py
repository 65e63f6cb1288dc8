"""
Tests for L{rmqha.tls}: TLS and mutual TLS between a master and a slave,
in memory (L{rmqha.testing.connect_in_memory}: TLS over C{iosim} with a C{Clock}), with
certificates generated per test by L{rmqha.certs}.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from cryptography import x509
from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from rmqha import certs
from rmqha._limits import LimitedFactory
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog
from rmqha.ha.master import MasterFactory
from rmqha.ha import slave as slave_module
from rmqha.ha.slave import SlaveFactory
from rmqha.testing import MemoryConnection, connect_in_memory
from rmqha.tls import (
    PeerPolicy,
    TLSError,
    TLSFiles,
    _VerifyingCreator,
    certificate_names,
    exposure_warning,
    plain_master_warning,
    ServerTLSFactory,
    server_context,
    split_description,
)
from twisted.internet import ssl

from tests._helpers import fixed_clock, make_message, open_store, segment_files, settings_and_runtime

SEGMENT = 4096


class PKI:
    """
    A CA, a master and slaves, written as PEM files under C{directory}.
    """

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.ca = certs.make_ca()
        certs.write_pair(self.ca, directory, "ca")
        self.ca_pem = os.path.join(directory, "ca.pem")

    def pair(self, stem: str, issued: certs.Issued) -> TLSFiles:
        cert, key = certs.write_pair(issued, self.directory, stem)
        return TLSFiles(cert, key, self.ca_pem)

    def master(self, **kw: Any) -> TLSFiles:
        names = ["master", "localhost"]
        return self.pair("master", certs.issue(self.ca, names[0], names, server=True, **kw))

    def slave(self, name: str, **kw: Any) -> TLSFiles:
        return self.pair(f"slave-{name}", certs.issue(self.ca, name, [name], client=True, **kw))


class TLSConversationTests(SynchronousTestCase):
    """
    A master and a slave over in-memory TLS.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.source = open_store(self, segment_size=SEGMENT)
        self.replica = open_store(self, segment_size=SEGMENT)
        self.pki = PKI(self.mktemp())
        for _ in range(30):
            self.source.put(make_message(b"t" * 300))

    def converse(
        self,
        master_files: TLSFiles,
        slave_files: TLSFiles,
        policy: PeerPolicy = PeerPolicy(require_client_cert=True),
        server_name: str = "master",
        slave_has_cert: bool = True,
        client_transport: Any = None,
        limited: bool = False,
        alpn: list[bytes] | None = None,
    ) -> tuple[MasterFactory, SlaveFactory, list[str]]:
        """
        Connect, pump until quiet; return both factories and the log
        (each line prefixed with its level, C{"warn: ..."}).

        @param limited: a connection limiter sits between TLS and the
            master, as on a broker's HA port.
        @param alpn: the slave offers these protocols (ALPN).
        """
        master = MasterFactory(self.source, self.clock, peer_policy=policy)
        slave = SlaveFactory(self.replica, self.clock)
        inner: Any = LimitedFactory(master, self.clock, name="HA") if limited else master
        # The master's side as on a listening port (rmqha.tls.server_endpoint).
        port = ServerTLSFactory(server_context(master_files, policy), inner, self.clock)
        options: dict[str, Any] = {}
        if slave_has_cert:
            key, cert, _ = slave_files.key_pair()
            options.update(privateKey=key, certificate=cert)
        creator = _VerifyingCreator(
            ssl.optionsForClientTLS(
                server_name,
                trustRoot=slave_files.trust_root(),
                extraCertificateOptions=options,
                acceptableProtocols=alpn,
            ),
            server_name,
        )
        with capturedLogs() as events:
            connection = connect_in_memory(
                port,
                slave,
                self.clock,
                slave_tls=creator,
                slave_transport=client_transport,
            )
            connection.slave.send_report()
            connection.flush()
            self.addCleanup(self._hang_up, connection)
        self.connection = connection
        return master, slave, [f"{e['log_level'].name}: {formatEvent(e)}" for e in events]

    def assertRefusedByMaster(self, log: list[str], why: str) -> None:
        """
        The master logged the refused handshake as one warning naming the
        slave's address, the port and C{why}, and never said the slave
        connected.
        """
        lines = [line for line in log if "TLS handshake from" in line]
        self.assertEqual(
            lines, [f"warn: TLS handshake from 127.0.0.1:50000 on the HA port failed: {why}"]
        )
        self.assertFalse([line for line in log if "slave 127.0.0.1:50000" in line], log)

    def _hang_up(self, connection: MemoryConnection) -> None:
        connection.hang_up()
        for call in self.clock.getDelayedCalls():
            call.cancel()

    def assertNothingReplicated(self, slave: SlaveFactory, master: MasterFactory) -> None:
        self.assertEqual(self.replica.max_offset, 0)
        self.assertEqual(slave.bytes_received, 0)
        self.assertEqual(slave.fruitless_connections, 1)
        self.assertEqual(master.slaves(), [])

    def test_mutual_tls_replicates(self) -> None:
        """
        A slave with a certificate from the CA, named in the allowlist,
        replicates the whole log; the master's status shows it as TLS with
        the verified name.
        """
        policy = PeerPolicy(require_client_cert=True, allowed_peers=frozenset({"slave-1"}))
        master, slave, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1"), policy
        )
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(
            segment_files(self.replica.store_dir), segment_files(self.source.store_dir)
        )
        (status,) = master.slaves()
        self.assertEqual((status.transport, status.identity), ("tls", "slave-1"))
        self.assertEqual(status.ack_offset, self.source.max_offset)
        self.assertIn("verified by TLS as slave-1", " ".join(log))

    def test_mutual_tls_through_connection_limiter(self) -> None:
        """
        The connection limiter is transparent: behind it the master still
        sees TLS, gets the handshake notification and the certificate, and
        the slave replicates.
        """
        master, _, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1"), limited=True
        )
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        (status,) = master.slaves()
        self.assertEqual((status.transport, status.identity), ("tls", "slave-1"))

    def test_slave_offering_alpn(self) -> None:
        """
        A client offering ALPN (as curl, browsers and Python's C{ssl} do)
        is served on the HA port, whose factory offers no protocol,
        directly or behind the connection limiter: no protocol is
        selected and the handshake succeeds (Twisted's callback would
        answer an empty name: OpenSSL's "internal error" alert).
        """
        master, _, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1"), limited=True, alpn=[b"h2", b"http/1.1"]
        )
        self.assertEqual(self.replica.max_offset, self.source.max_offset, log)
        self.assertIsNone(self.connection.server.negotiatedProtocol)
        self.assertEqual(len(master.slaves()), 1)

    def test_slave_certificate_from_certs_issue(self) -> None:
        """
        A slave certificate issued later from the CA C{certs init} wrote
        (C{rmqha certs issue}, client use only) is accepted by the master
        of that set, by name in the allowlist, and the slave replicates.
        """
        d = self.mktemp()
        certs.init(d, "master", ["s1"])
        issued = certs.issue_from(d, "s3", server=False, client=True, days=30)
        ca = f"{d}/ca.pem"
        policy = PeerPolicy(require_client_cert=True, allowed_peers=frozenset({"s3"}))
        master, _, log = self.converse(
            TLSFiles(f"{d}/master.pem", f"{d}/master.key", ca),
            TLSFiles(issued.cert, issued.key, ca),
            policy,
        )
        self.assertEqual(self.replica.max_offset, self.source.max_offset, log)
        (status,) = master.slaves()
        self.assertEqual(status.identity, "s3")

    def test_site_behind_limiter_negotiates_http_1_1(self) -> None:
        """
        The admin port (a C{Site} behind the connection limiter) selects
        the first of the Site's protocols the client offers: C{http/1.1}
        for curl's or a browser's C{h2, http/1.1} (C{h2} when HTTP/2 is
        installed), and the handshake succeeds.
        """
        from twisted.internet.protocol import Factory, Protocol
        from twisted.web.resource import Resource
        from twisted.web.server import Site

        site = Site(Resource())
        files = self.pki.master()
        port = ServerTLSFactory(
            server_context(TLSFiles(files.cert, files.key), PeerPolicy()),
            LimitedFactory(site, self.clock, name="HTTP"),
            self.clock,
            name="the admin HTTP port",
        )
        creator = ssl.optionsForClientTLS(
            "master", trustRoot=files.trust_root(), acceptableProtocols=[b"h2", b"http/1.1"]
        )
        with capturedLogs() as events:
            connection = connect_in_memory(
                port, Factory.forProtocol(Protocol), self.clock, slave_tls=creator
            )
            connection.flush()
        self.addCleanup(self._hang_up, connection)
        self.assertEqual([formatEvent(e) for e in events if "TLS" in formatEvent(e)], [])
        self.assertEqual(connection.client.negotiatedProtocol, site.acceptableProtocols()[0])
        self.assertEqual(connection.server.negotiatedProtocol, site.acceptableProtocols()[0])

    def test_socket_read_size_adapts_under_tls(self) -> None:
        """
        Under TLS the slave sizes the socket's reads (not the TLS layer's)
        by the plaintext a whole read brought: a backlog arriving in full
        reads grows them.
        """
        for _ in range(3000):
            self.source.put(make_message(b"t" * 300))
        sized: list[_SizedFakeTransport] = []

        def transport(protocol: Any) -> _SizedFakeTransport:
            sized.append(_SizedFakeTransport(protocol, isServer=False))
            return sized[-1]

        self.converse(self.pki.master(), self.pki.slave("s"), client_transport=transport)
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertGreater(sized[0].bufferSize, 64 * 1024)

    def test_catch_up_reads_batched_under_tls(self) -> None:
        """
        Under TLS too, a catch-up whose reactor turns bring a full largest
        read sets the TCP socket's wake-up threshold (the ciphertext's),
        and it goes back to one byte once reads stop.
        """
        for _ in range(6000):
            self.source.put(make_message(b"t" * 300))
        sized: list[_SocketFakeTransport] = []

        def transport(protocol: Any) -> _SocketFakeTransport:
            sized.append(_SocketFakeTransport(protocol, isServer=False))
            self.addCleanup(sized[-1].socket.close)
            return sized[-1]

        def threshold() -> int:
            return sized[0].socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)

        self.converse(self.pki.master(), self.pki.slave("s"), client_transport=transport)
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(threshold(), slave_module._BATCH_READS)
        self.clock.advance(slave_module._BATCH_IDLE)
        self.assertEqual(threshold(), 1)

    def test_tls_slave_against_plain_master(self) -> None:
        """
        A TLS slave dialling a plain-TCP master: the master drops the
        "report" its ClientHello makes, and the slave says the handshake
        did not complete, suggesting the port does not serve TLS.
        """
        master = MasterFactory(self.source, self.clock)
        slave = SlaveFactory(self.replica, self.clock)
        files = self.pki.slave("s")
        creator = _VerifyingCreator(
            ssl.optionsForClientTLS("master", trustRoot=files.trust_root()), "master"
        )
        with capturedLogs() as events:
            connection = connect_in_memory(master, slave, self.clock, slave_tls=creator)
            connection.flush()
        text = " ".join(formatEvent(e) for e in events)
        self.assertEqual(self.replica.max_offset, 0)
        self.assertIn("TLS connection to the master failed: the TLS handshake did not complete", text)
        self.assertIn("is the master serving TLS", text)

    def test_no_client_certificate(self) -> None:
        """
        A master requiring client certificates refuses a slave without one
        during the handshake; the slave logs that a certificate is needed.
        """
        master, slave, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1"), slave_has_cert=False
        )
        self.assertNothingReplicated(slave, master)
        self.assertIn("the master requires a client certificate", " ".join(log))
        self.assertRefusedByMaster(
            log,
            "the client presented no certificate (this port requires one signed by "
            "--tls-ca) (peer did not return a certificate)",
        )

    def test_peer_not_in_allowlist(self) -> None:
        """
        A valid certificate whose names are not allowed is dropped right
        after the handshake, before the first report is even read: no
        commit-log byte reaches the slave.  The master logs the names.
        """
        policy = PeerPolicy(require_client_cert=True, allowed_peers=frozenset({"slave-1"}))
        master, slave, log = self.converse(self.pki.master(), self.pki.slave("intruder"), policy)
        self.assertNothingReplicated(slave, master)
        text = " ".join(log)
        self.assertIn("its certificate names intruder, none of them in --tls-allowed-peers", text)
        self.assertIn("the master closed the connection after the TLS handshake", text)

    def test_client_certificate_from_another_ca(self) -> None:
        """
        A client certificate signed by a CA the master does not trust is
        refused in the handshake.
        """
        rogue = PKI(self.mktemp())
        rogue_slave = rogue.slave("slave-1")
        files = TLSFiles(rogue_slave.cert, rogue_slave.key, self.pki.ca_pem)
        master, slave, log = self.converse(self.pki.master(), files)
        self.assertNothingReplicated(slave, master)
        self.assertIn("not signed by a CA it trusts", " ".join(log))
        self.assertRefusedByMaster(
            log,
            "the client's certificate (issuer CN=rmqha test CA,O=rmqha) is not signed by a "
            "CA in --tls-ca (certificate verify failed)",
        )

    def test_master_from_unknown_ca(self) -> None:
        """
        The slave refuses a master whose certificate does not chain to its
        --tls-ca, and says so.
        """
        rogue = PKI(self.mktemp())
        rogue_slave = rogue.slave("slave-1")
        master, slave, log = self.converse(self.pki.master(), rogue_slave)
        self.assertNothingReplicated(slave, master)
        self.assertIn("which is not in --tls-ca", " ".join(log))
        self.assertRefusedByMaster(
            log,
            "the client refused this broker's certificate: it does not trust the CA "
            "that signed it (tlsv1 alert unknown ca)",
        )

    def test_wrong_server_name(self) -> None:
        """
        A master certificate for other names fails service_identity's
        check; the slave names the wanted and the actual names.
        """
        master, slave, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1"), server_name="other.example"
        )
        self.assertNothingReplicated(slave, master)
        self.assertIn(
            "the master's certificate is not for other.example (it is for master, localhost)",
            " ".join(log),
        )

    def test_ip_address_name(self) -> None:
        """
        An IP address as the server name is matched against the
        certificate's IP subject alternative names.
        """
        files = self.pki.pair(
            "master", certs.issue(self.pki.ca, "master", ["master"], ["127.0.0.1"], server=True)
        )
        master, _, _ = self.converse(files, self.pki.slave("s"), server_name="127.0.0.1")
        self.assertEqual(self.replica.max_offset, self.source.max_offset)

    def test_expired_master_certificate(self) -> None:
        """
        An expired master certificate is refused, with its validity dates.
        """
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
        files = self.pki.master(not_before=past, days=10)
        master, slave, log = self.converse(files, self.pki.slave("slave-1"))
        self.assertNothingReplicated(slave, master)
        text = " ".join(log)
        self.assertIn("has expired", text)
        self.assertIn(f"{past:%Y-%m-%d}", text)

    def test_expired_slave_certificate(self) -> None:
        """
        The master refuses an expired client certificate.
        """
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
        master, slave, log = self.converse(
            self.pki.master(), self.pki.slave("slave-1", not_before=past, days=10)
        )
        self.assertNothingReplicated(slave, master)
        self.assertIn("the master refused this slave's certificate: it has expired", " ".join(log))
        (line,) = [line for line in log if "TLS handshake from" in line]
        self.assertIn("on the HA port failed: the client's certificate (CN=slave-1,O=rmqha) "
                      "has expired: valid", line)
        self.assertTrue(line.endswith("UTC (certificate verify failed)"), line)


class HandshakeFailureLogTests(SynchronousTestCase):
    """
    L{ServerTLSFactory}'s warnings about failed handshakes are bounded.
    """

    def test_burst_then_count(self) -> None:
        """
        At most C{LOG_BURST} lines per C{LOG_WINDOW} seconds on one port,
        each naming the peer; the first line of a later window says how
        many failures went unlogged.  Every failure is counted.
        """
        from OpenSSL import SSL
        from twisted.internet.protocol import Factory, Protocol
        from twisted.python.failure import Failure

        from rmqha.testing import SLAVE_ADDRESS

        clock = Clock()
        files = PKI(self.mktemp()).master()
        port = ServerTLSFactory(
            server_context(TLSFiles(files.cert, files.key), PeerPolicy()),
            Factory.forProtocol(Protocol),
            clock,
            name="the HA port",
        )

        class Connection:
            transport = iosim.FakeTransport(Protocol(), isServer=True, peerAddress=SLAVE_ADDRESS)

        failure = Failure(SSL.Error([("SSL routines", "", "http request")]))
        with capturedLogs() as events:
            for _ in range(port.LOG_BURST + 5):
                port.handshake_failed(Connection(), failure)  # type: ignore[arg-type]
            clock.advance(port.LOG_WINDOW)
            port.handshake_failed(Connection(), failure)  # type: ignore[arg-type]
        lines = [formatEvent(e) for e in events]
        self.assertEqual(len(lines), port.LOG_BURST + 1)
        self.assertEqual(
            lines[0],
            "TLS handshake from 127.0.0.1:50000 on the HA port failed: the client spoke plain "
            "HTTP to this TLS port (use https://) (http request)",
        )
        self.assertTrue(
            lines[-1].endswith("(5 more failed on this port and were not logged)"), lines[-1]
        )
        self.assertEqual(port.handshake_failures, port.LOG_BURST + 6)


class _SizedFakeTransport(iosim.FakeTransport):
    """
    An iosim transport with a read size attribute, like a TCP transport
    (iosim delivers whatever is pending in one read, which is enough here).
    """

    bufferSize = 64 * 1024


class _SocketFakeTransport(_SizedFakeTransport):
    """
    A sized iosim transport with a C{socket} (one end of a socket pair)
    whose options the slave may set, as on a TCP transport.
    """

    def __init__(self, protocol: Any, isServer: bool) -> None:
        super().__init__(protocol, isServer)
        self.socket, peer = socket.socketpair()
        peer.close()


class PolicyTests(SynchronousTestCase):
    """
    L{PeerPolicy} and L{certificate_names}.
    """

    def setUp(self) -> None:
        self.ca = certs.make_ca()

    def cert(self, cn: str, dns: list[str]) -> x509.Certificate:
        return certs.issue(self.ca, cn, dns, client=True).certificate

    def test_names_are_dns_sans_else_cn(self) -> None:
        """
        DNS subject alternative names when there are any, else the CN.
        """
        self.assertEqual(certificate_names(self.cert("a", ["b", "c"])), ["b", "c"])
        self.assertEqual(certificate_names(self.cert("a", [])), ["a"])

    def test_allowlist(self) -> None:
        """
        One allowed name suffices and becomes the identity; none refuses.
        """
        policy = PeerPolicy(True, frozenset({"c"}))
        self.assertEqual(policy.check(self.cert("a", ["b", "c"])), ("c", None))
        identity, refusal = policy.check(self.cert("x", ["b"]))
        self.assertEqual(identity, "b")
        self.assertIn("none of them in --tls-allowed-peers", refusal or "")
        self.assertEqual(policy.check(None), (None, "it presented no client certificate"))
        self.assertEqual(PeerPolicy().check(None), (None, None))

    def test_allowlist_needs_client_certificates(self) -> None:
        """
        An allowlist without requiring certificates is a setting error.
        """
        self.assertRaises(TLSError, PeerPolicy, False, frozenset({"a"}))


class FileTests(SynchronousTestCase):
    """
    Loading PEM files: every problem names its flag and file.
    """

    def setUp(self) -> None:
        self.pki = PKI(self.mktemp())
        self.files = self.pki.master()

    def test_missing_file(self) -> None:
        """
        A file that cannot be read.
        """
        e = self.assertRaises(
            TLSError, TLSFiles("/nonexistent/x.pem", self.files.key).key_pair
        )
        self.assertEqual(str(e), "--tls-cert /nonexistent/x.pem: No such file or directory")

    def test_not_pem(self) -> None:
        """
        A file with no certificate, and a key that is not a key.
        """
        assert self.files.key is not None
        e = self.assertRaises(TLSError, TLSFiles(self.files.key, self.files.key).key_pair)
        self.assertIn("--tls-cert", str(e))
        self.assertIn("no PEM certificate", str(e))
        e = self.assertRaises(TLSError, TLSFiles(self.files.cert, self.files.cert).key_pair)
        self.assertIn("--tls-key", str(e))

    def test_key_of_another_certificate(self) -> None:
        """
        A key that does not belong to the certificate.
        """
        other = self.pki.slave("s")
        e = self.assertRaises(TLSError, TLSFiles(self.files.cert, other.key).key_pair)
        self.assertIn("is not the key of --tls-cert", str(e))

    def test_require_client_cert_needs_ca(self) -> None:
        """
        Requiring client certificates without a CA to check them against.
        """
        files = TLSFiles(self.files.cert, self.files.key)
        e = self.assertRaises(TLSError, server_context, files, PeerPolicy(True))
        self.assertIn("--tls-ca", str(e))


class DescriptionTests(SynchronousTestCase):
    """
    Endpoint descriptions and the plain-TCP warnings.
    """

    def test_split(self) -> None:
        """
        Type, positional and keyword arguments, with escaped colons.
        """
        self.assertEqual(
            split_description("ssl:10912:interface=\\:\\:1:backlog=5"),
            ("ssl", ["10912"], {"interface": "::1", "backlog": "5"}),
        )

    def test_exposure_warning(self) -> None:
        """
        Plain TCP on every interface or a routable one warns; loopback and
        TLS do not.
        """
        self.assertIn("all interfaces", str(exposure_warning("tcp:10912")))
        self.assertIn("10.0.0.5", str(exposure_warning("tcp:10912:interface=10.0.0.5")))
        for quiet in (
            "tcp:10912:interface=127.0.0.1",
            "tcp:0:interface=\\:\\:1",
            "tcp:1:interface=localhost",
            "ssl:10912",
            "unix:/tmp/ha.sock",
        ):
            self.assertIsNone(exposure_warning(quiet), quiet)

    def test_plain_master_warning(self) -> None:
        """
        A slave following a non-loopback master over TCP warns.
        """
        self.assertIsNone(plain_master_warning("127.0.0.1"))
        self.assertIsNone(plain_master_warning("::1"))
        self.assertIn("192.0.2.7", str(plain_master_warning("192.0.2.7")))


class BrokerWarningTests(SynchronousTestCase):
    """
    A broker says when its commit log travels in the clear.
    """

    def start(self, role: Role, **options: Any) -> list[str]:
        return [formatEvent(e) for e in self.warnings(role, **options)]

    def warnings(self, role: Role, **options: Any) -> list[dict[str, Any]]:
        reactor = MemoryReactorClock()
        store = self.mktemp()
        settings, runtime = settings_and_runtime(options, role=role)
        broker = Broker(
            settings,
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            **runtime,
        )
        with capturedLogs() as events:
            broker.startService()
        self.addCleanup(broker.stopService)
        return [e for e in events if e.get("log_level") == LogLevel.warn]

    def test_warnings_keep_their_fields(self) -> None:
        """
        The exposure warnings are log events with named fields (the port's
        description and where it listens; the master's host), not text
        formatted before logging.
        """
        (event,) = self.warnings(Role.MASTER, ha_listen="tcp:10912")
        self.assertEqual(
            (event["description"], event["where"]), ("tcp:10912", "all interfaces")
        )
        (event,) = self.warnings(Role.SLAVE, master_endpoint="tcp:host=192.0.2.7:port=10912")
        self.assertEqual(event["host"], "192.0.2.7")

    def test_master_on_all_interfaces(self) -> None:
        """
        Plain TCP on every interface warns that the commit log is exposed;
        loopback does not.
        """
        (warning,) = self.start(Role.MASTER, ha_listen="tcp:10912")
        self.assertIn("plain TCP on all interfaces", warning)
        self.assertEqual(self.start(Role.MASTER, ha_listen="tcp:10912:interface=127.0.0.1"), [])

    def test_slave_of_remote_master(self) -> None:
        """
        A slave following a non-loopback master over plain TCP warns.
        """
        (warning,) = self.start(Role.SLAVE, master_endpoint="tcp:host=192.0.2.7:port=10912")
        self.assertIn("replicating from 192.0.2.7 over plain TCP", warning)
        self.assertEqual(
            self.start(Role.SLAVE, master_endpoint="tcp:host=127.0.0.1:port=10912"), []
        )
