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


@pytest_twisted.ensureDeferred
async def test_sync_producers_stored_together(tmp_path: Any) -> None:
    """
    A SYNC_MASTER with one slave over real sockets and 24 concurrent
    producers, half awaiting C{put}, half chaining C{put_then}: the puts
    their callbacks make inside releases are stored together
    (docs/sync.md, "Puts released together are stored together").  Every
    put is PUT_OK with its own offset, each producer's messages are in the
    log in the order it made them, and both stores end byte-identical.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred, gatherResults

    from rmqha.ha.group import PutStatus

    master = _broker(
        reactor, str(tmp_path / "master"), Role.SYNC_MASTER, ha_listen="tcp:0:interface=127.0.0.1"
    )
    master.startService()
    slave_store = str(tmp_path / "slave")
    slave = None
    try:
        address = await master.ha_address()
        endpoint = f"tcp:host=127.0.0.1:port={address.port}"
        slave = _broker(reactor, slave_store, Role.SLAVE, master_endpoint=endpoint)
        slave.startService()
        await until(reactor, lambda: any(s.ack_offset is not None for s in master.slaves()), "the slave")
        per_producer = 400
        results: dict[int, list[Any]] = {n: [] for n in range(24)}
        # (The batches stored: no put_batch here, so each is puts held in
        # a release.)
        batches: list[int] = []
        store_batch = master.put_path._store_batch

        def counted(side: Any, messages: Any) -> Any:
            batches.append(len(messages))
            return store_batch(side, messages)

        master.put_path._store_batch = counted  # type: ignore[method-assign]

        async def awaiting(n: int) -> None:
            for i in range(per_producer):
                body = b"%d:%d:" % (n, i) + b"x" * 900
                results[n].append(await master.put(Message("GroupTopic", body, queue_id=n % 4)))

        def chaining(n: int) -> Deferred[None]:
            done: Deferred[None] = Deferred()

            def answered(result: Any) -> None:
                while True:
                    if result is not None:
                        results[n].append(result)
                    i = len(results[n])
                    if i == per_producer:
                        done.callback(None)
                        return
                    body = b"%d:%d:" % (n, i) + b"y" * 900
                    result = master.put_then(Message("GroupTopic", body, queue_id=n % 4), answered)
                    if result is None:
                        return

            answered(None)
            return done

        await gatherResults(
            [
                *(Deferred.fromCoroutine(awaiting(n)) for n in range(1, 24, 2)),
                *(chaining(n) for n in range(0, 24, 2)),
            ]
        )
        assert max(batches) > 1 and sum(batches) > 24 * per_producer // 2, batches[:20]
        for n, got in results.items():
            assert [r.status for r in got] == [PutStatus.PUT_OK] * per_producer, n
        offsets = {r.offset: (n, i) for n, got in results.items() for i, r in enumerate(got)}
        assert len(offsets) == 24 * per_producer
        seen: dict[int, int] = {}
        for record in master.commitlog.records():
            prefix = record.body.split(b":", 2)  # type: ignore[union-attr]
            n, i = int(prefix[0]), int(prefix[1])
            assert offsets[record.physical_offset] == (n, i)  # type: ignore[union-attr]
            assert seen.get(n, -1) == i - 1, (n, i)
            seen[n] = i
        assert master.put_path.put_statuses[PutStatus.PUT_OK] == 24 * per_producer
        await until(
            reactor,
            lambda: slave is not None and slave.commitlog.max_offset == master.commitlog.max_offset,
            "the slave to hold everything",
        )
        await slave.stopService()
        slave = None
    finally:
        if slave is not None:
            await slave.stopService()
        await master.stopService()
    assert store_digest(slave_store) == store_digest(str(tmp_path / "master"))
