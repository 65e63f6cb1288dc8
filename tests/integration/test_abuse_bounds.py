"""
Bounds under abuse over real sockets (issue 12, items 10 and 14): the
per-peer connection cap on the HA and HTTP ports, and a DIGEST flood that
does not stall the reactor.
"""

from __future__ import annotations

import time
from typing import Any

import pytest_twisted

from rmqha.ha._wire import CONTROL_HELLO, encode_code, encode_digest_request
from rmqha.broker import Role
from rmqha.store._record import Message

from tests._helpers import replication_of
from tests.integration._support import make_broker, until


class _Peer:
    """
    A client protocol that records whether it was closed.
    """

    def __init__(self) -> None:
        from twisted.internet.protocol import Protocol

        peer = self

        class P(Protocol):
            def dataReceived(self, data: bytes) -> None:
                peer.received += len(data)

            def connectionLost(self, reason: Any = None) -> None:
                peer.closed = True

        self.protocol = P()
        self.closed = False
        self.received = 0


async def _connect(reactor: Any, port: int) -> _Peer:
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

    peer = _Peer()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), peer.protocol)
    return peer


@pytest_twisted.ensureDeferred
async def test_per_peer_cap_on_both_ports(tmp_path: Any) -> None:
    """
    With --max-connections-per-peer 2, a third connection from 127.0.0.1
    to the HA port and to the HTTP port is closed at once; the first two
    stay open.
    """
    from twisted.internet import reactor

    master = make_broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        1 << 20,
        ha_listen="tcp:0:interface=127.0.0.1",
        http="tcp:0:interface=127.0.0.1",
        max_connections_per_peer=2,
    )
    master.startService()
    peers: list[_Peer] = []
    try:
        ha = (await master.ha_address()).port
        http = (await master.getServiceNamed("http").address()).port
        for port in (ha, http):
            kept = [await _connect(reactor, port) for _ in range(2)]
            extra = await _connect(reactor, port)
            peers += [*kept, extra]
            await until(reactor, lambda: extra.closed, "the extra connection to close", 10)
            assert not any(p.closed for p in kept)
        assert {name: f.refused for name, f in master.ports.port_limits.items()} == {"HA": 1, "HTTP": 1}
    finally:
        for peer in peers:
            if peer.protocol.transport is not None:
                peer.protocol.transport.abortConnection()
        await master.stopService()


@pytest_twisted.ensureDeferred
async def test_digest_flood_does_not_stall_the_reactor(tmp_path: Any) -> None:
    """
    1000 pipelined DIGEST requests of 1 MiB each: the reactor keeps
    turning (a 10 ms timer fires within 0.5 s) while they are answered one
    at a time.
    """
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    master = make_broker(
        reactor, str(tmp_path / "master"), Role.MASTER, 4 << 20,
        ha_listen="tcp:0:interface=127.0.0.1",
    )
    master.startService()
    peer = None
    try:
        for _ in range(3000):
            master.put(Message("Flood", b"f" * 1000))
        port = (await master.ha_address()).port
        peer = await _connect(reactor, port)
        assert peer.protocol.transport is not None
        peer.protocol.transport.write(
            encode_code(CONTROL_HELLO)
            + encode_digest_request(0, 1 << 20) * 1000
        )
        worst = 0.0
        for _ in range(20):
            started = time.monotonic()
            await deferLater(reactor, 0.01, lambda: None)
            worst = max(worst, time.monotonic() - started)
        assert worst < 0.5, worst
        await until(reactor, lambda: peer is not None and peer.received > 36 + 44, "answers", 30)
    finally:
        if peer is not None and peer.protocol.transport is not None:
            peer.protocol.transport.abortConnection()
        await master.stopService()


@pytest_twisted.ensureDeferred
async def test_slaves_declaring_one_id_count_once(tmp_path: Any) -> None:
    """
    Two real slaves whose stores hold the same replica id (a copied store)
    declare it over IDENTIFY: the master keeps one replication connection
    for them, so they count once for the quorum.
    """
    import os

    from twisted.internet import reactor

    from rmqha.ha.slave import load_replica_id

    master = make_broker(
        reactor, str(tmp_path / "master"), Role.SYNC_MASTER, 1 << 20,
        ha_listen="tcp:0:interface=127.0.0.1",
    )
    master.startService()
    slaves = []
    try:
        port = (await master.ha_address()).port
        replica_id = load_replica_id(str(tmp_path / "a"))
        os.makedirs(tmp_path / "b" / "rmqha")
        (tmp_path / "b" / "rmqha" / "replica-id").write_text(replica_id + "\n")
        for name in ("a", "b"):
            slave = make_broker(
                reactor, str(tmp_path / name), Role.SLAVE, 1 << 20,
                master_endpoint=f"tcp:host=127.0.0.1:port={port}",
            )
            slave.startService()
            slaves.append(slave)
        await until(
            reactor,
            lambda: sum(replication_of(s).connections_made for s in slaves) >= 2,
            "both slaves to connect",
            30,
        )
        await until(
            reactor,
            lambda: [s.replica_id for s in master.slaves()] == [replica_id]
            and len(master.master_factory.replicas.ack_offsets()) == 1,
            "one replica",
            30,
        )
    finally:
        for slave in slaves:
            await slave.stopService()
        await master.stopService()
