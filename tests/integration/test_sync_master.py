"""
SYNC_MASTER against a real slave process (twistd) that is paused with
SIGSTOP and resumed with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest_twisted

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.ha.group import PutStatus
from tools.processes import twistd_slave_command

from tests.integration._support import store_digest, until


@pytest_twisted.ensureDeferred
async def test_paused_slave(tmp_path: Any) -> None:
    """
    PUT_OK while the slave runs; FLUSH_SLAVE_TIMEOUT (message still
    stored) while it is stopped, then SLAVE_NOT_AVAILABLE at once once it
    has owed an ack for a second; PUT_OK again once it continues and acks;
    the slave ends with every message.
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    slave_store = str(tmp_path / "slave")
    master = Broker(
        BrokerSettings(
            role=Role.SYNC_MASTER,
            ha_listen="tcp:0:interface=127.0.0.1",
            heartbeat_interval=0.2,
            housekeeping_interval=30.0,
            slave_timeout=0.5,
        ),
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(master_store, segment_size=4 << 20, clock=reactor.seconds),
    )
    master.startService()
    slave = None
    try:
        port = (await master.ha_address()).port
        slave = subprocess.Popen(
            twistd_slave_command(
                slave_store,
                f"tcp:host=127.0.0.1:port={port}",
                str(tmp_path / "slave.log"),
                "--segment-size", str(4 << 20),
                "--heartbeat-interval", "200",
            )
        )
        # Connected is not enough: the slave checks the master over a
        # control session first, and a put before its first report finds no
        # slave to wait for (SLAVE_NOT_AVAILABLE).
        await until(
            reactor,
            lambda: any(s.ack_offset is not None for s in master.slaves()),
            "the slave's first report",
        )

        async def put() -> PutStatus:
            result = await master.put(Message("SyncTopic", b"s" * 512))
            return result.status

        assert [await put() for _ in range(20)] == [PutStatus.PUT_OK] * 20
        slave.send_signal(signal.SIGSTOP)
        statuses = [await put() for _ in range(4)]
        # Stored and timed out while the paused slave still counts; once it
        # has owed an ack for the link timeout (1 s, docs/sync.md "Who
        # counts as connected"), it does not: SLAVE_NOT_AVAILABLE at once.
        assert statuses[:2] == [PutStatus.FLUSH_SLAVE_TIMEOUT] * 2, statuses
        assert statuses[3] == PutStatus.SLAVE_NOT_AVAILABLE, statuses
        slave.send_signal(signal.SIGCONT)
        paused_end = master.commitlog.max_offset
        await until(
            reactor,
            lambda: any(s.ack_offset == paused_end for s in master.slaves()),
            "the slave to ack what it was sent while paused",
        )
        assert await put() == PutStatus.PUT_OK
        end = master.commitlog.max_offset
        await until(
            reactor,
            lambda: any(s.ack_offset == end for s in master.slaves()),
            "the slave to hold everything",
        )
        slave.send_signal(signal.SIGTERM)
        slave.wait(timeout=30)
        slave = None
    finally:
        if slave is not None:
            slave.send_signal(signal.SIGCONT)
            slave.kill()
            slave.wait()
        await master.stopService()
    assert store_digest(slave_store) == store_digest(master_store)
    assert master.put_path.put_statuses[PutStatus.FLUSH_SLAVE_TIMEOUT] == statuses.count(
        PutStatus.FLUSH_SLAVE_TIMEOUT
    )
    assert not os.path.exists(os.path.join(slave_store, "abort"))
