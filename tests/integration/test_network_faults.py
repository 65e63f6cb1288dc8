"""
Network faults between a master and a slave (both L{Broker}s in this
process) through L{tools.faultproxy.FaultProxy} on loopback: delay, a
stall longer than housekeeping, a reset in the middle of the stream,
flipped bits, and a half-open connection.  After each, replication
resumes, and the stores end byte-identical.
"""

from __future__ import annotations

import os
from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.task import deferLater
from twisted.logger import formatEvent, globalLogPublisher

from rmqha.broker import Broker, Role
from rmqha.store._record import Message
from tools.faultproxy import FaultProxy

from tests._helpers import replica_of
from tests.integration._support import make_broker, store_digest, until

SEGMENT = 4 * 1024 * 1024


def _broker(reactor: Any, store: str, role: Role, **kwargs: Any) -> Broker:
    return make_broker(reactor, store, role, SEGMENT, heartbeat_interval=0.2, housekeeping_interval=1.0, **kwargs)


@pytest_twisted.ensureDeferred
async def test_faults_then_identical(tmp_path: Any) -> None:
    """
    Each fault in turn while messages keep coming; the slave reconnects
    as needed and ends with the master's bytes.
    """
    from twisted.internet import reactor

    master = _broker(reactor, str(tmp_path / "master"), Role.MASTER,
                     ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    slave = None
    listening = None
    producing = True
    events: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        events.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        master_port = (await master.ha_address()).port
        proxy = FaultProxy(reactor, TCP4ClientEndpoint(reactor, "127.0.0.1", master_port))
        listening = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(proxy)
        slave = _broker(
            reactor, str(tmp_path / "slave"), Role.SLAVE,
            master_endpoint=f"tcp:host=127.0.0.1:port={listening.getHost().port}",
        )
        slave.startService()
        factory = replica_of(slave).slave_factory
        master_factory = master.master_factory
        assert factory is not None and master_factory is not None
        body = os.urandom(1024)

        async def produce() -> None:
            i = 0
            while producing:
                for _ in range(200):
                    await master.put(Message("FaultTopic", body, queue_id=i % 4))
                    i += 1
                await deferLater(reactor, 0.01, lambda: None)

        producer = Deferred.fromCoroutine(produce())

        async def caught_up() -> None:
            await until(
                reactor,
                lambda: slave.commitlog.record_end >= master.commitlog.max_offset - 300_000,
                "the slave to keep up",
                timeout=60,
            )

        await until(reactor, lambda: slave.commitlog.max_offset > 1_000_000, "replication")

        # Delay: slower, but flowing.
        proxy.faults.delay = 0.002
        before = slave.commitlog.max_offset
        await until(reactor, lambda: slave.commitlog.max_offset > before + 200_000, "delayed flow")
        proxy.faults.delay = 0.0

        # A stall longer than housekeeping: both ends give up, the slave
        # reconnects (through the still-stalled proxy), then flows again.
        made = factory.connections_made
        proxy.stall()
        # Housekeeping gives up on the silent peer and the slave reconnects
        # (through the still-stalled proxy).
        await until(reactor, lambda: factory.connections_made > made, "a reconnect during the stall")
        proxy.resume()
        await caught_up()

        # A reset in the middle of the stream (most likely mid-frame).
        made = factory.connections_made
        proxy.reset_after(150_000)
        await until(reactor, lambda: proxy.resets == 1, "the reset")
        await until(reactor, lambda: factory.connections_made > made, "a reconnect after the reset")
        await caught_up()

        # Flipped bits, both ways: checked framing catches every one (the
        # slave's record validation never sees a damaged record).
        assert factory.checked
        proxy.flip_bits(64 * 1024, 200, seed=1)
        await until(
            reactor,
            lambda: factory.checksum_failures >= 3 and master_factory.checksum_failures >= 1,
            "damaged frames and reports caught",
        )
        proxy.flip_bits(None)
        await caught_up()

        # Half-open: bytes vanish, nothing closes; housekeeping notices.
        made = factory.connections_made
        proxy.half_open()
        await until(reactor, lambda: factory.connections_made > made, "a reconnect after half-open")
        proxy.clear()

        producing = False
        await producer
        end = master.commitlog.max_offset
        await until(reactor, lambda: slave.commitlog.record_end == end, "the slave to catch up")
        await slave.stopService()
        slave = None
    finally:
        globalLogPublisher.removeObserver(observe)
        producing = False
        if slave is not None:
            await slave.stopService()
        await master.stopService()
        if listening is not None:
            await listening.stopListening()
    assert store_digest(str(tmp_path / "slave")) == store_digest(str(tmp_path / "master"))
    assert proxy.flips > 0
    assert not [e for e in events if "is corrupt" in e], "a damaged record got past the checksums"
