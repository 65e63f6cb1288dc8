"""
TLS and mutual TLS over real loopback sockets (pytest-twisted): a master
and a slave L{Broker} in this process with certificates generated per
test, the good case replicating byte for byte and each bad one refused
with the slave logging why and nothing replicated.
"""

from __future__ import annotations

import datetime
import os
import struct
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import formatEvent, globalLogPublisher

from rmqha import certs
from rmqha.broker import Broker, Role
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.tls import PeerPolicy, TLSFiles, client_endpoint, server_endpoint

from tests._helpers import replica_of, replication_of
from tests.integration._support import make_broker, store_digest, until

SEGMENT = 1024 * 1024


def _broker(reactor: Any, store: str, role: Role, **kwargs: Any) -> Broker:
    return make_broker(reactor, store, role, SEGMENT, **kwargs)


def _pki(directory: str) -> dict[str, Any]:
    """
    Two CAs' worth of key pairs: the real set and a rogue one.
    """
    os.makedirs(directory)
    ca = certs.make_ca()
    rogue = certs.make_ca("rogue CA")
    certs.write_pair(ca, directory, "ca")
    certs.write_pair(rogue, directory, "rogue-ca")
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)

    def pair(stem: str, issued: certs.Issued, ca_stem: str = "ca") -> TLSFiles:
        cert, key = certs.write_pair(issued, directory, stem)
        return TLSFiles(cert, key, os.path.join(directory, f"{ca_stem}.pem"))

    return {
        "master": pair("master", certs.issue(ca, "master", ["master", "localhost"],
                                             ["127.0.0.1"], server=True)),
        "expired-master": pair("expired-master", certs.issue(
            ca, "master", ["master"], ["127.0.0.1"], server=True, not_before=past, days=10)),
        "slave-1": pair("slave-1", certs.issue(ca, "slave-1", ["slave-1"], client=True)),
        "intruder": pair("intruder", certs.issue(ca, "intruder", ["intruder"], client=True)),
        "rogue-slave": pair("rogue-slave",
                            certs.issue(rogue, "slave-1", ["slave-1"], client=True)),
        # A slave that trusts the rogue CA only (so not the real master).
        "slave-trusting-rogue": pair(
            "slave-1b", certs.issue(ca, "slave-1", ["slave-1"], client=True), "rogue-ca"
        ),
    }


CASES = {
    "good": dict(),
    "wrong CA": dict(slave="slave-trusting-rogue",
                     error="which is not in --tls-ca"),
    "wrong server name": dict(server_name="other.example",
                              error="the master's certificate is not for other.example"),
    "no client certificate": dict(
        slave_cert=False, error="the master requires a client certificate",
        master_log="on the HA port failed: the client presented no certificate"),
    "client certificate from another CA": dict(
        slave="rogue-slave", error="not signed by a CA it trusts",
        master_log="on the HA port failed: the client's certificate (issuer CN=rogue CA"),
    "not in the allowlist": dict(slave="intruder",
                                 error="the master closed the connection after the TLS handshake",
                                 master_log="none of them in --tls-allowed-peers"),
    "expired master certificate": dict(master="expired-master", error="has expired"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest_twisted.ensureDeferred
async def test_tls(tmp_path: Any, case: str) -> None:
    """
    Each case over real sockets: the good one replicates 4 MiB over several
    segments byte for byte and shows the slave's verified name in the
    master's status; each bad one leaves the slave empty, with one log
    line naming the reason, and keeps the slave retrying (its check of the
    master, which replication waits for).
    """
    from twisted.internet import reactor

    spec: dict[str, Any] = CASES[case]
    pki = _pki(str(tmp_path / "pki"))
    events: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        events.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    policy = PeerPolicy(require_client_cert=True, allowed_peers=frozenset({"slave-1"}))
    master_files = pki[spec.get("master", "master")]
    master = _broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        ha_listen=server_endpoint(reactor, "ssl:0:interface=127.0.0.1", master_files, policy),
        tls_cert=master_files.cert,
        tls_key=master_files.key,
        tls_ca=master_files.ca,
        tls_require_client_cert=policy.require_client_cert,
        tls_allowed_peers=policy.allowed_peers,
    )
    master.startService()
    slave = None
    try:
        body = os.urandom(1024)
        for i in range(4 * 1024):
            await master.put(Message("TLSTopic", body, queue_id=i % 4))
        port = (await master.ha_address()).port
        slave_files = pki[spec.get("slave", "slave-1")]
        if spec.get("slave_cert", True) is False:
            slave_files = TLSFiles(ca=slave_files.ca)
        slave = _broker(
            reactor,
            str(tmp_path / "slave"),
            Role.SLAVE,
            master_endpoint=client_endpoint(
                reactor, "127.0.0.1", port, slave_files, spec.get("server_name", "master")
            ),
        )
        slave.startService()
        factory = replica_of(slave).slave_factory
        assert factory is not None
        if "error" not in spec:
            await until(
                reactor,
                lambda: slave.commitlog.max_offset == master.commitlog.max_offset,
                "the slave to catch up",
            )
            (status,) = master.slaves()
            assert (status.transport, status.identity) == ("tls", "slave-1")
            await slave.stopService()
            slave = None
            assert store_digest(str(tmp_path / "slave")) == store_digest(str(tmp_path / "master"))
        else:
            # The check of the master comes first: refused, it is retried
            # with a back-off and replication never starts.
            await until(reactor, lambda: replication_of(slave).failed_checks >= 2, "two refusals")
            assert slave.commitlog.max_offset == 0
            assert factory.bytes_received == 0
            failures = [e for e in events if "TLS connection to the master failed" in e]
            assert failures, events
            assert spec["error"] in failures[0], failures[0]
            if "master_log" in spec:
                assert any(spec["master_log"] in e for e in events), events
    finally:
        globalLogPublisher.removeObserver(observe)
        if slave is not None:
            await slave.stopService()
        await master.stopService()


@pytest_twisted.ensureDeferred
async def test_plain_slave_tls_master_gets_a_hint(tmp_path: Any) -> None:
    """
    A slave without --tls-ca following a TLS master: the master closes the
    probe unanswered (OpenSSL sends no alert for bytes that are no TLS
    record), and the slave says to give --tls-ca if the master serves TLS,
    retrying; it neither takes the master for a RocketMQ one nor
    replicates anything.
    """
    from twisted.internet import reactor

    pki = _pki(str(tmp_path / "pki"))
    master_files = pki["master"]
    events: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        events.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    master = _broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        ha_listen=server_endpoint(
            reactor, "ssl:0:interface=127.0.0.1", TLSFiles(master_files.cert, master_files.key),
            PeerPolicy(),
        ),
    )
    master.startService()
    slave = None
    try:
        await master.put(Message("TLSTopic", b"x" * 100))
        port = (await master.ha_address()).port
        slave = _broker(
            reactor,
            str(tmp_path / "slave"),
            Role.SLAVE,
            master_endpoint=f"tcp:host=127.0.0.1:port={port}",
        )
        slave.startService()
        await until(reactor, lambda: replication_of(slave).failed_checks >= 1, "a failed check")
        assert replication_of(slave).master_kind != "rocketmq"
        assert slave.problem is not None and "--tls-ca" in slave.problem, slave.problem
        assert slave.commitlog.max_offset == 0
        hints = [e for e in events if "if it serves TLS, give this slave --tls-ca" in e]
        assert hints, events
        assert "not falling back" not in "\n".join(events)
    finally:
        globalLogPublisher.removeObserver(observe)
        if slave is not None:
            await slave.stopService()
        await master.stopService()


class _SilentMaster(Protocol):
    """
    A RocketMQ 4.9 master as its slave sees it behind a TLS terminator: it
    sends nothing while the request offset is -1 (the probe's value), takes
    the first other report as the request offset and sends its log from
    there, then a heartbeat; it records every report.
    """

    def __init__(self, log: bytes, connections: list["_SilentMaster"]) -> None:
        self.log = log
        self.reports: list[int] = []
        self._buffer = b""
        self.lost = False
        connections.append(self)

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 8:
            (value,) = struct.unpack(">q", self._buffer[:8])
            self._buffer = self._buffer[8:]
            self.reports.append(value)
            if [r for r in self.reports if r != -1] == [value] and value != -1:
                body = self.log[value:]
                assert self.transport is not None
                self.transport.write(
                    struct.pack(">qi", value, len(body)) + body
                    + struct.pack(">qi", len(self.log), 0)
                )

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True


@pytest_twisted.ensureDeferred
async def test_probe_kept_over_tls(tmp_path: Any) -> None:
    """
    A master silent to the probe behind TLS (a RocketMQ master behind a
    TLS terminator): the slave replicates on the probe's own TLS
    connection -- one connection, the -1 then the real report, never
    closed -- and catches up.
    """
    from twisted.internet import reactor

    pki = _pki(str(tmp_path / "pki"))
    source = CommitLog.open(str(tmp_path / "source"), segment_size=SEGMENT, clock=lambda: 1.0)
    for i in range(20):
        source.put(Message("TLSTopic", os.urandom(500), queue_id=i % 4))
    log = source.read(0, source.max_offset)
    source.close()
    connections: list[_SilentMaster] = []
    master_files = pki["master"]
    port = await server_endpoint(
        reactor, "ssl:0:interface=127.0.0.1", TLSFiles(master_files.cert, master_files.key),
        PeerPolicy(),
    ).listen(Factory.forProtocol(lambda: _SilentMaster(log, connections)))
    slave = None
    try:
        slave = _broker(
            reactor,
            str(tmp_path / "slave"),
            Role.SLAVE,
            master_endpoint=client_endpoint(
                reactor, "127.0.0.1", port.getHost().port, pki["slave-1"], "master"
            ),
        )
        slave.startService()
        await until(reactor, lambda: slave.commitlog.max_offset == len(log), "the slave to catch up")
        assert replication_of(slave).master_kind == "rocketmq"
        (connection,) = connections
        assert connection.reports[:2] == [-1, 0], connection.reports
        assert not connection.lost
        assert replication_of(slave).connections_made == 1
    finally:
        if slave is not None:
            await slave.stopService()
        await port.stopListening()
