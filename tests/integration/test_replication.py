"""
Real-socket replication on 127.0.0.1 (pytest-twisted, the global reactor):
a master and a slave L{Broker} in this process, a backlog of more than
64 MiB over several segments, slave restarts and a dropped connection in
the middle, and byte-identical segment files at the end.
"""

from __future__ import annotations

import os
from typing import Any

import pytest_twisted
from twisted.internet.task import deferLater

from rmqha.broker import Broker, Role
from rmqha.store._record import Message

from tests._helpers import replica_of
from tests.integration._support import make_broker, store_digest, until

SEGMENT = 8 * 1024 * 1024
BODY = 1024
# 64 MiB and a little more, in 1 KiB messages (1,141-byte records).
COUNT = 64 * 1024 * 1024 // 1141 + 1000


def _broker(reactor: Any, store: str, role: Role, **kwargs: Any) -> Broker:
    return make_broker(reactor, store, role, SEGMENT, **kwargs)


@pytest_twisted.ensureDeferred
async def test_replicates_with_restarts(tmp_path: Any) -> None:
    """
    64 MiB+ over 8 MiB segments reaches the slave while it is stopped and
    restarted twice and has its connection dropped once; both stores end
    byte-identical, and the master sees the slave's ack at its max offset.
    """
    from twisted.internet import reactor

    master = _broker(reactor, str(tmp_path / "master"), Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    try:
        address = await master.ha_address()
        endpoint = f"tcp:host=127.0.0.1:port={address.port}"
        slave_store = str(tmp_path / "slave")

        def start_slave() -> Broker:
            slave = _broker(reactor, slave_store, Role.SLAVE, master_endpoint=endpoint)
            slave.startService()
            return slave

        body = os.urandom(BODY)
        produced = 0

        async def produce(n: int) -> None:
            nonlocal produced
            for i in range(n):
                await master.put(Message("ReplTopic", body, queue_id=i % 4))
                if i % 2000 == 0:
                    await deferLater(reactor, 0, lambda: None)
            produced += n

        slave = start_slave()
        await produce(COUNT // 3)
        await until(reactor, lambda: slave.commitlog.max_offset > 0, "the slave to start")
        await slave.stopService()
        # The slave is down while the master takes more.
        await produce(COUNT // 3)
        slave = start_slave()
        await until(
            reactor,
            lambda: slave.commitlog.max_offset > master.commitlog.max_offset // 2,
            "the slave to catch up half way",
        )
        # A dropped connection: the slave reconnects and resumes by itself.
        factory = replica_of(slave).slave_factory
        connection = factory.connection if factory else None
        assert connection is not None
        connection.transport.abortConnection()
        await produce(COUNT - 2 * (COUNT // 3))
        await slave.stopService()
        slave = start_slave()
        await until(
            reactor,
            lambda: slave.commitlog.max_offset == master.commitlog.max_offset,
            "the slave to catch up",
        )
        await until(
            reactor,
            lambda: any(s.ack_offset == master.commitlog.max_offset for s in master.slaves()),
            "the master to see the slave's ack",
        )
        assert master.commitlog.max_offset > 64 * 1024 * 1024
        assert len(master.commitlog.segments) >= 8
        await slave.stopService()
    finally:
        await master.stopService()
    assert store_digest(slave_store) == store_digest(str(tmp_path / "master"))
